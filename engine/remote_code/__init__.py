"""A release's own modeling code (`auto_map`), run only in a child process: `sandbox` starts
and watches it, `child` is its entry point."""

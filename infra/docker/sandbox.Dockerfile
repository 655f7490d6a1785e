# The reward sandbox as a service (`posttrain sandbox serve`), for remote reward workers.
# Stdlib-only: no torch, no CUDA. Run it with --network none semantics for jobs (the server binds a port,
# the jobs it forks get their own network namespace) and a read-only root:
#   docker run --read-only --tmpfs /tmp --cap-add SYS_ADMIN --pids-limit 512 --memory 4g -p 8081:8081 posttrain-sandbox
FROM python:3.11-slim
ENV PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
WORKDIR /app
COPY sandbox sandbox
EXPOSE 8081
CMD ["python", "-m", "sandbox", "serve", "--host", "0.0.0.0", "--port", "8081"]

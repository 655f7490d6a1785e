# The reward sandbox as a service (`posttrain sandbox serve`), for remote reward workers.
# Stdlib-only: no torch, no CUDA. Run it with --network none semantics for jobs (the server binds a port,
# the jobs it forks get their own network namespace) and a read-only root. Keep its port on a private network
# (compose: the `sandbox` profile, reached as http://sandbox:8081), never published on the host:
#   docker run --read-only --tmpfs /tmp --cap-add SYS_ADMIN --pids-limit 512 --memory 4g --network posttrain \
#     -e POSTTRAIN_SANDBOX_TOKEN posttrain-sandbox
FROM python:3.11-slim
ENV PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
WORKDIR /app
COPY sandbox sandbox
EXPOSE 8081
CMD ["python", "-m", "sandbox", "serve", "--host", "0.0.0.0", "--port", "8081"]

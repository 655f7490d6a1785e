# The MLflow tracking server on its own small image: the train image is multi-GB (CUDA, torch, vLLM) and a
# tracking server needs none of it. Versions follow requirements/constraints.txt.
FROM python:3.11-slim
ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1
RUN pip install "mlflow==3.17.2" "boto3==1.44.8" "psycopg2-binary>=2.9,<3" \
 && useradd --create-home --uid 1000 mlflow
USER mlflow
EXPOSE 5000
CMD ["mlflow", "server", "--host", "0.0.0.0", "--port", "5000"]

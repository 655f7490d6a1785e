# Airflow 3 with the posttrain operators, plugin and DAGs (no torch: stages run in the train image).
FROM apache/airflow:3.3.2-python3.11
USER root
RUN apt-get update && apt-get install -y --no-install-recommends git && rm -rf /var/lib/apt/lists/*
USER airflow
COPY --chown=airflow:root pyproject.toml README.md /opt/posttrain/
COPY --chown=airflow:root operators /opt/posttrain/operators
COPY --chown=airflow:root plugins /opt/posttrain/plugins
COPY --chown=airflow:root training/__init__.py training/stage.py training/storage.py training/tracking.py \
     training/config.py /opt/posttrain/training/
COPY --chown=airflow:root dags /opt/airflow/dags
# Operators import the stage-result protocol from training/ (stdlib at import time) but nothing heavier.
RUN pip install --no-cache-dir "apache-airflow==3.3.2" apache-airflow-providers-docker apache-airflow-providers-amazon \
      "docker>=7" "boto3>=1.35" "mlflow-skinny>=3.0"
ENV PYTHONPATH=/opt/posttrain

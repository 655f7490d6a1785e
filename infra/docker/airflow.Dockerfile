# Airflow 3 with the posttrain operators, plugin and DAGs (no torch: stages run in the train image).
FROM apache/airflow:3.3.2-python3.11
USER root
RUN apt-get update && apt-get install -y --no-install-recommends git && rm -rf /var/lib/apt/lists/*
USER airflow
COPY --chown=airflow:root pyproject.toml README.md /opt/posttrain/
COPY --chown=airflow:root operators /opt/posttrain/operators
COPY --chown=airflow:root plugins /opt/posttrain/plugins
# Only the torch-free training modules the operators, plugin and DAG files import (the trigger form reads the
# profiles, rollout engine names and gate metric labels). tests/deploy/test_airflow_image.py imports every DAG
# from exactly these files with torch blocked, so a missing one fails there rather than in the dag-processor.
COPY --chown=airflow:root training/__init__.py training/stage.py training/storage.py training/storage_backends.py \
     training/tracking.py training/config.py training/profiles.py training/model_size.py training/lease.py \
     training/recipes.py training/run_config.py \
     /opt/posttrain/training/
COPY --chown=airflow:root training/rollout/__init__.py training/rollout/base.py /opt/posttrain/training/rollout/
COPY --chown=airflow:root training/evaluation/__init__.py training/evaluation/gate_config.py \
     /opt/posttrain/training/evaluation/
COPY --chown=airflow:root recipes /opt/posttrain/recipes
COPY --chown=airflow:root dags /opt/airflow/dags
# Operators import the stage-result protocol from training/ (stdlib at import time) but nothing heavier.
RUN pip install --no-cache-dir "apache-airflow==3.3.2" apache-airflow-providers-docker apache-airflow-providers-amazon \
      "docker>=7" "boto3>=1.35" "mlflow-skinny>=3.0"
ENV PYTHONPATH=/opt/posttrain

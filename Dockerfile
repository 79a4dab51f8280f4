# The kftrain project image: every pipeline step and every training replica runs it.
#
#   docker build -t REGISTRY/kftrain:0.1.0 .                                 # CPU
#   docker build --build-arg TORCH_VARIANT=cuda -t REGISTRY/kftrain:0.1.0-cuda .   # NVIDIA GPUs
#
# Nothing is installed at run time: the steps run with install_kfp_package=False.
ARG PYTHON_VERSION=3.11
FROM python:${PYTHON_VERSION}-slim

# cpu: PyTorch's CPU wheel (small); cuda: the default Linux wheel, which bundles CUDA and NCCL.
ARG TORCH_VARIANT=cpu
ARG TORCH_VERSION=2.13.0

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /opt/kftrain
COPY pyproject.toml constraints.txt README.md ./
COPY trainer/ trainer/
COPY components/ components/
COPY pipelines/ pipelines/

RUN if [ "$TORCH_VARIANT" = "cpu" ]; then \
        pip install --index-url https://download.pytorch.org/whl/cpu "torch==${TORCH_VERSION}"; \
    else \
        pip install "torch==${TORCH_VERSION}"; \
    fi \
    && pip install -c constraints.txt ".[validate]" \
    && python -c "import trainer.train, kfp, kubeflow.training"

RUN useradd --create-home --uid 1000 --shell /usr/sbin/nologin kftrain
USER 1000
WORKDIR /home/kftrain

# dpsweep: one image for every service of docker-compose.yml (API + scheduler, migrations,
# Ray head and Ray workers). Secrets never go into the image: they come from the environment
# at run time (see .env.example).
#
#   docker build -t dpsweep .                                  # CPU build of torch
#   docker build -t dpsweep:cuda --build-arg TORCH_VARIANT=cu126 .   # CUDA 12.6 build
ARG PYTHON_VERSION=3.11
FROM python:${PYTHON_VERSION}-slim

# cpu, or a CUDA build tag of the PyTorch wheel index (cu118, cu121, cu124, cu126, ...).
ARG TORCH_VARIANT=cpu
ARG TORCH_VERSION=2.13.0

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    RAY_USAGE_STATS_ENABLED=0 \
    DPSWEEP_DATA_DIR=/data

# /data holds uploads and /artifacts trained models: compose's named volumes mounted there take
# these owners, so the unprivileged user can write them.
RUN apt-get update \
    && apt-get install -y --no-install-recommends curl \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 1000 dpsweep \
    && mkdir -p /data /app /artifacts && chown dpsweep:dpsweep /data /app /artifacts

WORKDIR /app

# torch first, from the index of the chosen build; the constraint then keeps every later pip
# call on exactly this torch (otherwise opacus would pull whatever torch it likes).
RUN pip install --index-url "https://download.pytorch.org/whl/${TORCH_VARIANT}" \
        "torch==${TORCH_VERSION}" \
    && echo "torch==${TORCH_VERSION}" > /tmp/torch-constraint.txt

COPY pyproject.toml README.md ./
COPY dpsweep ./dpsweep
COPY sweeper ./sweeper
COPY workers ./workers
COPY api ./api
COPY migrations ./migrations
RUN pip install -c /tmp/torch-constraint.txt ".[server]"

USER dpsweep
EXPOSE 8000
# The API's default command; compose overrides it per service.
CMD ["dpsweep", "serve", "--host", "0.0.0.0", "--port", "8000"]

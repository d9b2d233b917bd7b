# One image for every role; the command picks it (see compose.yaml and docs/deploy.md):
#   web:        python -m core.serve -b 0.0.0.0 -p 8000 chatsite.asgi:application
#   dispatcher: python manage.py run_dispatcher
#   worker:     python -m worker --engine llamacpp
FROM python:3.11-slim-bookworm

# A C++ toolchain for llama-cpp-python, built for a portable x86-64 baseline as the Makefile
# does (a native build may use instructions a virtual machine's kernel does not enable).
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential cmake git \
 && rm -rf /var/lib/apt/lists/*
ENV CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON" \
    PIP_NO_CACHE_DIR=1 \
    PYTHONUNBUFFERED=1 \
    DJANGO_SETTINGS_MODULE=chatsite.settings.production \
    STATIC_ROOT=/srv/static

WORKDIR /srv/app
# Dependencies first, so a code change does not rebuild them. torch's CPU build, as pinned.
COPY pyproject.toml README.md ./
RUN mkdir -p apps chatsite worker \
 && pip install --upgrade "pip>=24" \
 && pip install --extra-index-url https://download.pytorch.org/whl/cpu .
COPY . .
RUN pip install --no-deps . \
 && SECRET_KEY=build ALLOWED_HOSTS=build python manage.py collectstatic --no-input -v 0

RUN useradd --system --home /srv sluice && chown -R sluice /srv
USER sluice
EXPOSE 8000
CMD ["python", "-m", "core.serve", "-b", "0.0.0.0", "-p", "8000", "chatsite.asgi:application"]

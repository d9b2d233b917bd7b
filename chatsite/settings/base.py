"""Settings shared by every environment. Every environment variable is read through `env`."""

from __future__ import annotations

from chatsite.settings import process
from chatsite.settings.environment import BASE_DIR, env

SECRET_KEY = env.str("SECRET_KEY", default="dev-only-insecure-key-change-me")
DEBUG = env.bool("DEBUG", default=False)
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["127.0.0.1", "localhost", "testserver"])
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])

INSTALLED_APPS = [
    "daphne",
    # The admin, on a site that refuses staff without a second factor once that is required
    # (apps/accounts/admin_site.py).
    "apps.accounts.admin_site.SluiceAdminConfig",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.postgres",
    "channels",
    "django_htmx",
    "template_partials",
    "allauth",
    "allauth.account",
    "allauth.socialaccount",
    "allauth.socialaccount.providers.openid_connect",
    "allauth.mfa",
    "apps.accounts",
    "apps.streams",
    "apps.admission",
    "apps.rag",
    "apps.inbox",
    "apps.usage",
    "apps.chat",
    "apps.api",
    "apps.ops",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # ServeStatic, WhiteNoise's asynchronous fork: every middleware here runs on the event loop,
    # so a request to an async view (the API's streams) makes no hop through a thread.
    "servestatic.middleware.ServeStaticMiddleware",
    "apps.ops.middleware.RequestMetricsMiddleware",  # after ServeStatic: static files not counted
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "allauth.account.middleware.AccountMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "core.middleware.BackendOutageMiddleware",
]

ROOT_URLCONF = "chatsite.urls"
ASGI_APPLICATION = "chatsite.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {"default": env.db("DATABASE_URL", default="postgresql:///sluice")}
# Persistent connections: a new PostgreSQL connection per websocket message costs more than the
# message's own queries. Health checks drop a connection the server closed.
DATABASES["default"]["CONN_MAX_AGE"] = env.int("DATABASE_CONN_MAX_AGE", default=60)
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
# Seconds to connect: a PostgreSQL that accepts but never answers fails a connection attempt
# instead of hanging it (libpq's minimum is 2).
DATABASES["default"].setdefault("OPTIONS", {}).setdefault(
    "connect_timeout", env.int("DATABASE_CONNECT_TIMEOUT", default=5)
)
# The statements every answer runs are prepared on their 5th use on a connection (see
# core/prepared.py); 0 prepares nothing, for a pooler that cannot keep prepared statements.
DATABASE_PREPARE_THRESHOLD = env.int("DATABASE_PREPARE_THRESHOLD", default=5)
DATABASES["default"]["OPTIONS"].setdefault("prepare_threshold", DATABASE_PREPARE_THRESHOLD or None)
# Web processes serve each HTTP request on a thread of its own, so with one connection per
# thread a burst of requests opens as many PostgreSQL connections (and past max_connections
# fails). They borrow from a bounded pool instead: a request waits up to DATABASE_POOL_TIMEOUT
# seconds for a free connection, then answers 503. A connection goes back to the pool after each
# request or websocket frame (hence CONN_MAX_AGE 0, which the pool requires), and the pool checks
# it as it hands it out (CONN_HEALTH_CHECKS), so none is stale after a PostgreSQL restart. Other
# processes (dispatcher, management commands) keep their one persistent connection.
# DATABASE_POOL_MAX_SIZE=0 turns the pool off.
DATABASE_POOL_MIN_SIZE = env.int("DATABASE_POOL_MIN_SIZE", default=2)
DATABASE_POOL_MAX_SIZE = env.int("DATABASE_POOL_MAX_SIZE", default=16)
DATABASE_POOL_TIMEOUT = env.float("DATABASE_POOL_TIMEOUT", default=5.0)
if process.is_web and DATABASE_POOL_MAX_SIZE > 0:
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    # Named, so pg_stat_activity tells the web's connections from the dispatcher's.
    DATABASES["default"]["OPTIONS"].setdefault("application_name", "sluice-web")
    DATABASES["default"]["OPTIONS"]["pool"] = {
        "min_size": min(DATABASE_POOL_MIN_SIZE, DATABASE_POOL_MAX_SIZE),
        "max_size": DATABASE_POOL_MAX_SIZE,
        "timeout": DATABASE_POOL_TIMEOUT,
        "name": "sluice-web",
    }

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = env.str("REDIS_URL", default="redis://127.0.0.1:6379/0")
# Synchronous Redis connections per process (a blocking pool: callers wait, never grow it).
# Unset, a web process takes one per websocket database thread plus 4 (see WEB_DB_THREADS:
# each submit makes three round trips, and threads waiting on each other for a connection
# cost CPU); other processes 4.
REDIS_POOL_SIZE = env.int("REDIS_POOL_SIZE", default=0)
# Seconds a Redis command (or waiting for a pooled connection) may take before it fails, and
# seconds to connect: a frozen Redis costs a request this long, never forever.
REDIS_SOCKET_TIMEOUT = env.float("REDIS_SOCKET_TIMEOUT", default=5.0)
REDIS_CONNECT_TIMEOUT = env.float("REDIS_CONNECT_TIMEOUT", default=2.0)
# Prefix of every Redis key Sluice writes; tests give each test its own.
SLUICE_REDIS_PREFIX = env.str("SLUICE_REDIS_PREFIX", default="sluice")

CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": SLUICE_REDIS_PREFIX + ":cache",
    }
}

if REDIS_URL.split("://", 1)[0] in ("redis+cluster", "rediss+cluster"):
    # Django's Redis cache speaks to one node; nothing in Sluice caches through it.
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

# No channel layer: answers reach websockets through each web process's output hub
# (apps/streams/hub.py), which reads the output streams directly. A layer would give every socket
# a channel of its own to poll, for messages nobody sends.

AUTH_USER_MODEL = "accounts.User"
LOGIN_URL = "accounts:login"
LOGIN_REDIRECT_URL = "chat:index"
LOGOUT_REDIRECT_URL = "accounts:login"
# ModelBackend first: sessions made before django-allauth (and force_login in tests) name it.
AUTHENTICATION_BACKENDS = [
    "django.contrib.auth.backends.ModelBackend",
    "allauth.account.auth_backends.AuthenticationBackend",
]

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

# Failed logins allowed per account and client address within the window (the site's login
# and the admin's alike).
LOGIN_THROTTLE_ATTEMPTS = env.int("LOGIN_THROTTLE_ATTEMPTS", default=5)
LOGIN_THROTTLE_WINDOW_SECONDS = env.int("LOGIN_THROTTLE_WINDOW_SECONDS", default=60)

from chatsite.settings.accounts import *  # noqa: E402, F403  (sign-up, mail, OIDC, TOTP)

# How long a reason given to read another person's conversation opens it in the reader's
# session (apps/accounts/read_gate.py); one record stands for that window.
STAFF_READ_GRANT_SECONDS = env.int("STAFF_READ_GRANT_SECONDS", default=600)

# Seconds /health/ gives each backing service to answer; both are asked at once, so a frozen
# PostgreSQL or Redis still gets an answer (503, naming it) well within a second.
HEALTH_CHECK_TIMEOUT = env.float("HEALTH_CHECK_TIMEOUT", default=0.5)

# Chat limits checked before anything is stored.
CHAT_MESSAGE_MAX_CHARS = env.int("CHAT_MESSAGE_MAX_CHARS", default=8000)
# Usage accounting (apps/usage): each answer's own row is kept this many days, the hourly
# sums this many (`manage.py apply_retention` deletes older ones).
USAGE_REQUEST_DAYS = env.int("USAGE_REQUEST_DAYS", default=90)
USAGE_ROLLUP_DAYS = env.int("USAGE_ROLLUP_DAYS", default=730)
CHAT_TITLE_MAX_CHARS = 120
# Conversation data (apps/chat inbox, retention).
# An answer that took this long (or a `long` request) leaves "your answer is ready" in the inbox.
INBOX_ANSWER_READY_SECONDS = env.float("INBOX_ANSWER_READY_SECONDS", default=20.0)
# Threads per web process for the websocket's database work (each keeps one connection, from the
# pool in a web process), so messages from many chats are stored and submitted side by side.
WEB_DB_THREADS = env.int("WEB_DB_THREADS", default=8)
if process.is_web and DATABASE_POOL_MAX_SIZE > 0:
    # They keep their connections: at least half the pool stays for HTTP requests.
    WEB_DB_THREADS = max(1, min(WEB_DB_THREADS, DATABASE_POOL_MAX_SIZE // 2))
if REDIS_POOL_SIZE < 1:
    REDIS_POOL_SIZE = WEB_DB_THREADS + 4 if process.is_web else 4

LANGUAGE_CODE = "en-us"
TIME_ZONE = env.str("TIME_ZONE", default="UTC")
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
# Optional: with ServeStatic's finders on, `collectstatic` into STATIC_ROOT is only an optimisation.
STATIC_ROOT = env.str("STATIC_ROOT", default=None)
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}

# LOG_FORMAT=json: one JSON object per line, each line about a request with its request_id
# (contract/logs.py); the dispatcher and the workers log the same way.
LOG_FORMAT = env.str("LOG_FORMAT", default="plain")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"},
        "json": {"()": "contract.logs.JsonFormatter", "process": "web" if process.is_web else ""},
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": "json" if LOG_FORMAT == "json" else "plain",
        }
    },
    "root": {"handlers": ["console"], "level": env.str("LOG_LEVEL", default="INFO")},
    "loggers": {"django.channels.server": {"level": "WARNING"}},
}

# Static files are served by the app itself (ServeStatic), straight from the source folders,
# so `make run` needs no collectstatic step.
SERVESTATIC_USE_FINDERS = True

# Retrieval (apps/rag; docs/retrieval.md describes each setting)
RAG_EMBEDDING_MODEL_PATH = env.str("RAG_EMBEDDING_MODEL_PATH", default="")
# Retrieval models (apps/rag/embeddings.py, docs/retrieval.md): the model new corpora are
# embedded with; where all-MiniLM-L6-v2 runs ("local": in each web process, "fleet": on
# `python -m worker embed` workers, and no web process imports torch); other models this
# process may run itself (name=folder,...); every other model is served by workers.
RAG_EMBEDDING_MODEL = env.str("RAG_EMBEDDING_MODEL", default="all-MiniLM-L6-v2")
RAG_EMBEDDING_SERVING = env.str("RAG_EMBEDDING_SERVING", default="local")
RAG_LOCAL_EMBEDDING_MODELS = env.dict("RAG_LOCAL_EMBEDDING_MODELS", default={})
# A question's embedding (or reranking) on the fleet waits this long; ingestion's, longer. With
# no answer: "answer" goes on without passages (and says so in the log and metrics), "refuse"
# turns the question away with a message to try again.
RAG_EMBED_TIMEOUT_SECONDS = env.float("RAG_EMBED_TIMEOUT_SECONDS", default=2.0)
RAG_EMBED_BULK_TIMEOUT_SECONDS = env.float("RAG_EMBED_BULK_TIMEOUT_SECONDS", default=120.0)
RAG_EMBEDDING_UNAVAILABLE = env.str("RAG_EMBEDDING_UNAVAILABLE", default="answer")
# A model whose workers have not beaten for this long is taken as served by none (3 beats).
RAG_FLEET_STALE_SECONDS = env.float("RAG_FLEET_STALE_SECONDS", default=6.0)
# A corpus gets its own HNSW index from this many passages; a smaller one is scanned exactly.
RAG_HNSW_MIN_CHUNKS = env.int("RAG_HNSW_MIN_CHUNKS", default=1000)
# Changing a corpus's model re-embeds it in batches of this many passages; the old vectors are
# cleared this long after the swap (searches that read the corpus before it finish first).
RAG_REEMBED_BATCH = env.int("RAG_REEMBED_BATCH", default=256)
RAG_REEMBED_GRACE_SECONDS = env.float("RAG_REEMBED_GRACE_SECONDS", default=30.0)
# 100 word pieces: MiniLM matches a question to a short passage better than to a long one, and
# several fit the prompt's share (bench/rag.py's labelled questions; 64 matched worse again).
RAG_CHUNK_TOKENS = env.int("RAG_CHUNK_TOKENS", default=100)
RAG_CHUNK_OVERLAP = env.int("RAG_CHUNK_OVERLAP", default=20)
RAG_EMBED_BATCH = env.int("RAG_EMBED_BATCH", default=64)
RAG_TEXT_SEARCH_CONFIG = env.str("RAG_TEXT_SEARCH_CONFIG", default="english")
RAG_CANDIDATES = env.int("RAG_CANDIDATES", default=40)
# While the service sheds load (degradation level 2+): a much smaller candidate pool per list.
RAG_DEGRADED_CANDIDATES = env.int("RAG_DEGRADED_CANDIDATES", default=8)
# HNSW search breadth. With the index built at ef_construction 200 (apps/rag/models.py), 40
# gives 0.956 recall@10 over 100,000 passages and 50 gives 0.965 for under a millisecond more:
# the default keeps a margin over 0.95 however the index was built.
RAG_HNSW_EF_SEARCH = env.int("RAG_HNSW_EF_SEARCH", default=50)
RAG_FULLTEXT_POOL_PER_TERM = env.int("RAG_FULLTEXT_POOL_PER_TERM", default=50)
RAG_TOP_K = env.int("RAG_TOP_K", default=5)
RAG_MIN_SIMILARITY = env.float("RAG_MIN_SIMILARITY", default=0.2)
# The share of each corpus's mean embedding taken out of the question and the passage before
# their cosine (apps/rag/centering.py): passages near the corpus's centre (introductions,
# overviews) then stop matching every question. 0 is the plain cosine.
RAG_MEAN_REMOVAL = env.float("RAG_MEAN_REMOVAL", default=0.5)
# A second stage that reorders the best RAG_RERANK_CANDIDATES passages after the relevance
# gate: a cross-encoder (a local sentence-transformers folder) or a language model's .gguf file
# (apps/rag/query_likelihood.py); none by default.
RAG_RERANK_MODEL = env.str("RAG_RERANK_MODEL", default="")
RAG_RERANK_CANDIDATES = env.int("RAG_RERANK_CANDIDATES", default=20)
# The passages' share of a prompt, in model tokens (about four characters each): every token
# is read before the first word of the answer, so the passages are cut to this.
RAG_PROMPT_TOKENS = env.int("RAG_PROMPT_TOKENS", default=400)
RAG_QUERY_CACHE_SIZE = env.int("RAG_QUERY_CACHE_SIZE", default=1024)
RAG_QUERY_CACHE_TTL = env.int("RAG_QUERY_CACHE_TTL", default=86400)
RAG_RESULT_CACHE_TTL = env.int("RAG_RESULT_CACHE_TTL", default=300)
RAG_UPLOAD_MAX_BYTES = env.int("RAG_UPLOAD_MAX_BYTES", default=20 * 1024 * 1024)
# Files users attach in the chat (their private corpus): the largest file, how many files and
# how many bytes in all one user may keep, and after how long an ingestion that stopped
# reporting (its process died) is started again.
RAG_USER_FILE_MAX_BYTES = env.int("RAG_USER_FILE_MAX_BYTES", default=10 * 1024 * 1024)
RAG_USER_FILES_MAX = env.int("RAG_USER_FILES_MAX", default=50)
RAG_USER_FILES_MAX_TOTAL_BYTES = env.int(
    "RAG_USER_FILES_MAX_TOTAL_BYTES", default=100 * 1024 * 1024
)
RAG_USER_FILE_STALE_SECONDS = env.int("RAG_USER_FILE_STALE_SECONDS", default=300)

# The model as the web sees it: its context window and the default answer length. The prompt
# builder keeps the recent turns that fit CONTEXT - MAX_TOKENS.
MODEL_CONTEXT_TOKENS = env.int("MODEL_CONTEXT_TOKENS", default=2048)
MODEL_MAX_TOKENS = env.int("MODEL_MAX_TOKENS", default=512)
MODEL_TEMPERATURE = env.float("MODEL_TEMPERATURE", default=0.7)

# Images in the OpenAI API (apps/api/openai_images.py): the largest image a data: URL may hold
# and how many one request may send (the body as a whole stays under Django's
# DATA_UPLOAD_MAX_MEMORY_SIZE, 2.5 MB). Remote http(s) image URLs are refused unless
# API_IMAGE_URLS is on; then they go to the engine as given, and the engine fetches them (the
# web process never does).
API_IMAGE_MAX_BYTES = env.int("API_IMAGE_MAX_BYTES", default=1024 * 1024)
API_IMAGES_PER_REQUEST = env.int("API_IMAGES_PER_REQUEST", default=4)
API_IMAGE_URLS = env.bool("API_IMAGE_URLS", default=False)

# Requests go through admission control (the dispatcher: plans, fair queue); False sends them
# straight to the work stream.
SLUICE_ADMISSION = env.bool("SLUICE_ADMISSION", default=True)
# The model a request that names none runs on (a name workers announce with
# --served-model-name); empty: the first, by name, that a live worker serves.
SLUICE_DEFAULT_MODEL = env.str("SLUICE_DEFAULT_MODEL", default="")
# Background requests (work Sluice starts itself, behind every person's request): rolling
# summaries of long conversations, follow-up questions after each answer, and profile tags
# proposed after every N questions a user asks (0: never).
SLUICE_SUMMARIES = env.bool("SLUICE_SUMMARIES", default=True)
SLUICE_FOLLOWUPS = env.bool("SLUICE_FOLLOWUPS", default=True)
SLUICE_TAG_PROPOSAL_EVERY = env.int("SLUICE_TAG_PROPOSAL_EVERY", default=10)
# A new chat's title written by the model (apps/chat/titles.py), after its first question.
SLUICE_TITLES = env.bool("SLUICE_TITLES", default=True)

# Admission control (apps/admission; docs/admission.md describes each setting)
SLUICE_DISPATCHER_LEASE_MS = env.int("SLUICE_DISPATCHER_LEASE_MS", default=5000)
SLUICE_ADMISSION_BATCH = env.int("SLUICE_ADMISSION_BATCH", default=500)
SLUICE_ADMISSION_PREFETCH = env.int("SLUICE_ADMISSION_PREFETCH", default=0)
SLUICE_ADMISSION_QUANTUM = env.int("SLUICE_ADMISSION_QUANTUM", default=256)
# Routing to workers (apps/admission/routing.py): "affinity" (pull + KV-cache affinity, the
# default), "pull" (shared stream only), "round-robin" and "least-loaded" (push, as a load
# balancer would: benchmarks only). Affinity lives this long in Redis after the last answer,
# and a worker loaded beyond SLUICE_AFFINITY_MAX_LOAD (busy + waiting for it, per slot) gets
# no more work routed to it: the shared stream takes it. At 1.0 a request waits for no full
# worker: waiting costs seconds of time to first token to save a fraction of a second of
# prefill (bench/fleet.py, goodput at TTFT p99 <= 2 s).
SLUICE_ROUTING = env.str("SLUICE_ROUTING", default="affinity")
SLUICE_AFFINITY_TTL_SECONDS = env.int("SLUICE_AFFINITY_TTL_SECONDS", default=1800)
SLUICE_AFFINITY_MAX_LOAD = env.float("SLUICE_AFFINITY_MAX_LOAD", default=1.0)
METRICS_TOKEN = env.str("METRICS_TOKEN", default="")
# The dispatcher's Prometheus endpoint (its own HTTP port; 0: off, as two dispatchers on one
# machine would want the same port). Web processes serve theirs at /metrics.
DISPATCHER_METRICS_PORT = env.int("DISPATCHER_METRICS_PORT", default=0)
DISPATCHER_METRICS_ADDR = env.str("DISPATCHER_METRICS_ADDR", default="0.0.0.0")

# Web processes load the embedding model in the background at startup (about 400 MB), so the
# first question does not wait for it.
RAG_WARM_UP = env.bool("RAG_WARM_UP", default=True)

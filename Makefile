# Two entry points: `make run` serves the app, `make test` runs the whole suite.
# Both create .venv from the pinned dependencies on first use (and again when they change).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PORT ?= 8000
# A client frame of up to 4 MiB reaches Craft, which answers an oversized prompt with an error
# frame; daphne's own limit (1 MiB) would close the socket instead.
DAPHNE_OPTIONS := --websocket-max-message-size 4194304 --websocket-max-frame-size 4194304
# The virtualenv's scripts (craft-demo-agent, daphne) must be found by subprocesses too.
export PATH := $(CURDIR)/$(BIN):$(PATH)
# The key that encrypts the credentials people store for their agents (docs/agents.md): for
# the app that `make run` and `make run-cluster` serve, one is generated under var/ on first
# use, as the admin password is, unless one is given. Not for `make test`, whose settings
# have a key of their own.
ifeq ($(origin CRAFT_SECRETS_KEY)$(origin CRAFT_SECRETS_KEY_FILE),undefinedundefined)
secrets-key migrate run run-cluster: export CRAFT_SECRETS_KEY_FILE := $(CURDIR)/var/secrets-key
endif

.PHONY: secrets-key run run-cluster test bench lint format venv dev-venv browser node haproxy isolation stress-ng realagent migrate clean

$(BIN)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints.txt -e .
	touch $@

$(BIN)/.installed-dev: $(BIN)/.installed
	$(BIN)/pip install --quiet -c constraints.txt -e '.[dev]'
	touch $@

venv: $(BIN)/.installed
dev-venv: $(BIN)/.installed-dev

secrets-key: venv
	@if [ -n "$$CRAFT_SECRETS_KEY_FILE" ] && [ ! -e "$$CRAFT_SECRETS_KEY_FILE" ]; then \
	  mkdir -p "$$(dirname "$$CRAFT_SECRETS_KEY_FILE")"; \
	  (umask 077; $(BIN)/python -c 'from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())' > "$$CRAFT_SECRETS_KEY_FILE"); \
	  echo "Generated the credentials key in $$CRAFT_SECRETS_KEY_FILE (keep it: stored keys need it)"; \
	fi

migrate: venv secrets-key
	mkdir -p var
	DJANGO_DEBUG=$${DJANGO_DEBUG:-1} $(BIN)/python manage.py migrate --noinput
	DJANGO_DEBUG=$${DJANGO_DEBUG:-1} $(BIN)/python manage.py collectstatic --noinput -v 0

# Previews (docs/workbench.md) are served by the same daphne on the next port, on names under
# .localhost (every browser sends those to loopback): never on Craft's own origin.
PREVIEW_PORT ?= $(shell echo $$(($(PORT) + 1)))
run: export CRAFT_PREVIEW_ORIGIN ?= http://{port}-{session}.localhost:$(PREVIEW_PORT)
run: migrate isolation
	DJANGO_DEBUG=$${DJANGO_DEBUG:-1} $(BIN)/python manage.py ensure_admin
	@echo "Serving Craft on http://127.0.0.1:$(PORT)/ (previews on port $(PREVIEW_PORT))"
	DJANGO_DEBUG=$${DJANGO_DEBUG:-1} $(BIN)/daphne $(DAPHNE_OPTIONS) -b 127.0.0.1 -p $(PORT) \
	  -e tcp:port=$(PREVIEW_PORT):interface=127.0.0.1 craft.asgi:application

# Several daphne workers behind HAProxy on PostgreSQL and Redis (docs/deployment.md):
# WORKERS=3 by default; DATABASE_URL and REDIS_URL may point elsewhere.
WORKERS ?= 3
run-cluster: venv secrets-key haproxy isolation
	$(BIN)/python deploy/cluster/run.py --workers $(WORKERS) --port $(PORT)

haproxy:
	@command -v haproxy >/dev/null 2>&1 || test -x /usr/sbin/haproxy || { \
	  echo "Installing Debian's haproxy for make run-cluster"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq haproxy >/dev/null; }

# As root, local agents run as sandbox users in a bubblewrap jail, in a network of their
# sandbox's own (pasta, from Debian's passt) behind an nftables rule (README, "What the local
# backend isolates"): without these, sandboxes refuse to start.
isolation:
	@if [ "$$(id -u)" = 0 ] && ! { test -x /usr/bin/bwrap && test -x /usr/sbin/nft && test -x /usr/bin/git && test -x /usr/bin/pasta; }; then \
	  echo "Installing Debian's bubblewrap, nftables, passt and git for sandbox isolation and checkpoints"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap nftables passt git >/dev/null; \
	fi

# Debian's Chromium for the browser tests (Playwright's own browser download is not used).
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "Installing Debian's chromium for the browser tests"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

# Node for the page script's unit tests (tests/js/): its own test runner, no npm packages.
# Debian's nodejs (Node 18 in bookworm) is enough.
node:
	@command -v node >/dev/null 2>&1 || { \
	  echo "Installing Debian's nodejs for the page script's tests"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs >/dev/null; } \
	  || { echo "The page script's tests need node: install Debian's nodejs (apt-get install nodejs)." >&2; exit 1; }

# Debian's stress-ng: a test stops the server while every CPU is busy.
stress-ng:
	@command -v stress-ng >/dev/null 2>&1 || { \
	  echo "Installing Debian's stress-ng for the tests under load"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq stress-ng >/dev/null; }

lint: dev-venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

format: dev-venv
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# Real third-party ACP agents for the realagent tests, which `make test` runs as root with
# sandbox users, the jail and the sandbox's network on. From npm, at the versions pinned in
# tests/realagent/package.json: opencode (about 180 MB), Claude Code's ACP adapter (with the
# Claude Agent SDK and Claude Code, a native binary; about 260 MB), Codex's ACP adapter (a
# native binary; about 225 MB) and Gemini CLI (about 100 MB). fast-agent, pinned here, in a
# virtualenv of its own (about 340 MB) as its releases with an ACP server do not install on
# this project's Python: Python 3.13 (the version it was tried with), found on PATH or
# through pyenv; skipped without one. Sandbox users must be able to run that Python: one
# they cannot (pyenv's, under /root) is copied into tests/realagent/python3.13 (without its
# own tests) and told where its libpython is (Debian's patchelf).
REALAGENTS := $(addprefix tests/realagent/node_modules/.bin/,opencode claude-agent-acp codex-acp gemini)
FAST_AGENT_VERSION := 0.10.48
FAST_AGENT_VENV := tests/realagent/fast-agent
FAST_AGENT_PYTHON := tests/realagent/python3.13

realagent: tests/realagent/.installed

tests/realagent/.installed: tests/realagent/package.json Makefile
	cd tests/realagent && npm install --no-audit --no-fund --no-package-lock
	@python=$$(python3.13 -c 'import sys; print(sys.executable)' 2>/dev/null \
	  || { command -v pyenv >/dev/null \
	       && version=$$(pyenv versions --bare | grep -E '^3\.13(\.[0-9]+)?$$' | tail -n 1) \
	       && [ -n "$$version" ] && PYENV_VERSION=$$version pyenv which python3.13; } 2>/dev/null); \
	if [ -z "$$python" ]; then \
	  echo "Skipped fast-agent: it is installed with Python 3.13, and found none (python3.13 on PATH, or in pyenv)."; \
	else \
	  if [ "$$(id -u)" = 0 ] && ! setpriv --reuid=65534 --regid=65534 --clear-groups "$$python" -c '' 2>/dev/null; then \
	    echo "Copying $$python into $(FAST_AGENT_PYTHON), where sandbox users can run it"; \
	    command -v patchelf >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq patchelf >/dev/null; }; \
	    prefix=$$("$$python" -c 'import sys; print(sys.base_prefix)'); \
	    rm -rf $(FAST_AGENT_PYTHON) $(FAST_AGENT_VENV) && mkdir -p $(FAST_AGENT_PYTHON) \
	    && cp -a "$$prefix"/bin "$$prefix"/lib "$$prefix"/include $(FAST_AGENT_PYTHON)/ \
	    && rm -rf $(FAST_AGENT_PYTHON)/lib/python3.13/test $(FAST_AGENT_PYTHON)/lib/python3.13/site-packages/* \
	    && patchelf --set-rpath '$$ORIGIN/../lib' $(FAST_AGENT_PYTHON)/bin/python3.13 \
	    && chmod -R a+rX $(FAST_AGENT_PYTHON) \
	    && python=$(CURDIR)/$(FAST_AGENT_PYTHON)/bin/python3.13; \
	  fi; \
	  echo "Installing fast-agent-mcp $(FAST_AGENT_VERSION) with $$python"; \
	  "$$python" -m venv $(FAST_AGENT_VENV) \
	  && $(FAST_AGENT_VENV)/bin/pip install --quiet --upgrade pip \
	  && $(FAST_AGENT_VENV)/bin/pip install --quiet fast-agent-mcp==$(FAST_AGENT_VERSION) \
	  && chmod -R a+rX $(FAST_AGENT_VENV); \
	fi
	touch $@

# The suite runs on three processes (pytest-xdist), each with its own test database and Redis
# database; PYTEST_WORKERS=0 runs it in this one.
PYTEST_WORKERS ?= 3

test: dev-venv browser haproxy isolation node stress-ng realagent lint
	node --test tests/js/
	$(BIN)/pytest -n $(PYTEST_WORKERS) --dist loadfile --durations=25 $(PYTEST_ARGS)
	$(BIN)/pytest -n $(PYTEST_WORKERS) --dist loadfile -m realagent tests/realagent

# The benchmarks of bench/ as one table (SQLite; BENCH_DATABASE_URL=postgres://... for PostgreSQL).
bench: dev-venv browser
	$(BIN)/python -m bench $(BENCH_ARGS)

clean:
	rm -rf $(VENV) var .pytest_cache .ruff_cache tests/realagent/node_modules tests/realagent/.installed $(FAST_AGENT_VENV) $(FAST_AGENT_PYTHON)

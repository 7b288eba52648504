# Quick start:  make demo   (set up + run the sandboxed demo)
#               make test   (set up + run the test suite)
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
HELPER := sandlock/_libexec/sandlock-exec
FORKLOOP := sandlock/_libexec/libsandlock-fork.so
FASTCONNECT := sandlock/_libexec/libsandlock-fastconnect.so
CLIENT := sandlock/_libexec/sandlock-client

.PHONY: setup helper demo test bench clean

setup: $(BIN)/.installed helper
	@$(BIN)/python -m compileall -q sandlock netpolicy >/dev/null  # bytecode, even under PYTHONDONTWRITEBYTECODE

$(BIN)/.installed: pyproject.toml scripts/setup-system
	./scripts/setup-system
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]' --config-settings editable_mode=compat  # a .pth path entry: no import hook at every start
	# The [mcp] extra, on its own: mcp 2 needs h11>=0.16 and mitmproxy 11 (Python 3.11) pins
	# h11<=0.14, which pip cannot resolve in one install; installed after, pip warns about the
	# pin and both work (the suite runs on h11 0.16; the HTTP filter frames strictly itself).
	$(BIN)/pip install -q 'mcp>=2' 2>$(VENV)/mcp-install.log || { cat $(VENV)/mcp-install.log; exit 1; }
	touch $@

helper: $(HELPER) $(FORKLOOP) $(FASTCONNECT) $(VENV)/.client-installed

# The `sandlock` command's fast path (docs/cli.md "The CLI service"): installed over the
# console script pip wrote; it runs `python -P -m sandlock` for whatever it does not handle.
$(CLIENT): sandlock/_libexec/sandlock-client.c
	cc -O2 -Wall -Wextra -Werror -static -DSANDLOCK_PYTHON_DEFAULT='"$(abspath $(BIN))/python"' -o $@ $<

$(VENV)/.client-installed: $(CLIENT) $(BIN)/.installed
	cp $(CLIENT) $(BIN)/sandlock.new && mv $(BIN)/sandlock.new $(BIN)/sandlock
	touch $@

$(HELPER): sandlock/_libexec/sandlock-exec.c sandlock/_libexec/sandlock-init.c sandlock/_libexec/sandlock-init.h
	cc -O2 -Wall -Wextra -Werror -static -o $@ sandlock/_libexec/sandlock-exec.c sandlock/_libexec/sandlock-init.c

$(FORKLOOP): sandlock/_libexec/forkloop.c
	cc -O2 -Wall -Wextra -Werror -shared -fPIC -o $@ $<

$(FASTCONNECT): sandlock/_libexec/fastconnect.c sandlock/_libexec/fastcow.c sandlock/_libexec/fastpath.h
	cc -O2 -Wall -Wextra -Werror -shared -fPIC -pthread -o $@ sandlock/_libexec/fastconnect.c sandlock/_libexec/fastcow.c

demo: setup
	$(BIN)/python examples/demo.py

test: setup
	$(BIN)/python -m pytest -q

bench: setup
	$(BIN)/python bench/run.py
	$(BIN)/python bench/update_readme.py

clean:
	rm -rf $(VENV) $(HELPER) $(FORKLOOP) $(FASTCONNECT) $(CLIENT) build *.egg-info

#!/bin/sh
# Installs the system tools some end-to-end tests use, from Debian's packages:
#   prometheus  tests/e2e/test_prometheus.py (a real Prometheus scraping Ray's metrics)
#   chromium    tests/e2e/test_dashboard_screenshot.py (a headless screenshot of the Ray dashboard)
# `make test` runs it before pytest. It never fails the build: without apt-get, root (or sudo
# without a password) or network, it says so and the tests that need a tool skip with a reason.
# Set PDML_SKIP_TOOL_INSTALL=1 to skip it.

missing=""
command -v prometheus >/dev/null 2>&1 || missing="$missing prometheus"
[ -x /usr/bin/chromium ] || command -v chromium >/dev/null 2>&1 || missing="$missing chromium"
if [ -z "$missing" ]; then
    echo "install_test_tools: prometheus and chromium are installed"
    exit 0
fi
if [ -n "$PDML_SKIP_TOOL_INSTALL" ]; then
    echo "install_test_tools: PDML_SKIP_TOOL_INSTALL is set; not installing:$missing (their tests skip)"
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install_test_tools: no apt-get here; not installing:$missing (their tests skip)"
    exit 0
fi
if [ "$(id -u)" -eq 0 ]; then
    SUDO=""
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    SUDO="sudo -n"
else
    echo "install_test_tools: not root and no password-less sudo; not installing:$missing (their tests skip)"
    exit 0
fi
echo "install_test_tools: installing$missing with apt-get (at most 10 minutes)"
export DEBIAN_FRONTEND=noninteractive
# bounded: a mirror that does not answer must not hold the build (apt's own timeouts are per try)
LIMIT=""
command -v timeout >/dev/null 2>&1 && LIMIT="timeout 600"
if $LIMIT $SUDO apt-get update -qq >/dev/null 2>&1 \
        && $LIMIT $SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null 2>&1; then
    echo "install_test_tools: installed$missing"
else
    echo "install_test_tools: apt-get could not install$missing (offline, or over the time limit?); their tests skip"
fi
exit 0

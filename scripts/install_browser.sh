#!/usr/bin/env bash
# Debian's chromium and chromedriver for the status page's browser test (tests/system/test_status_page_chromium.py); a no-op when both are there.
set -euo pipefail
if { command -v chromium && command -v chromedriver; } >/dev/null 2>&1; then exit 0; fi
as_root=""; [ "$(id -u)" = 0 ] || as_root="sudo"
install() { $as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver >/dev/null; }
install || { $as_root apt-get update -q >/dev/null && install; }

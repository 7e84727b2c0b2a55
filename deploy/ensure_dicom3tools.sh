#!/usr/bin/env bash
# Make sure Debian's dicom3tools is installed: the DICOM SR export's tests check every exported
# file with its `dciodvfy` (tests fail in CI without it). Called by `make test` (and so by CI).
# Needs root (or sudo) only when dciodvfy is missing.
set -euo pipefail
if command -v dciodvfy >/dev/null 2>&1; then exit 0; fi
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "ensure_dicom3tools: installing Debian's dicom3tools for the DICOM SR tests" >&2
$sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dicom3tools >/dev/null
command -v dciodvfy >/dev/null 2>&1 || { echo "ensure_dicom3tools: dciodvfy is missing" >&2; exit 1; }

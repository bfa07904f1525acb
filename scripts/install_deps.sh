#!/usr/bin/env bash
# Installs SlideDP's build and test dependencies from Debian packages. Safe to run repeatedly.
# Set SLIDEDP_SKIP_APT=1 to skip (e.g. on a machine where they are already present), SLIDEDP_TEST_DEPS=0 to
# leave out what only the tests need, SLIDEDP_FUZZ_DEPS=1 to add what scripts/fuzz.sh needs.
set -euo pipefail
[ "${SLIDEDP_SKIP_APT:-0}" = "1" ] && exit 0

packages=(
  build-essential cmake ninja-build pkg-config git
  libyaml-cpp-dev libsqlite3-dev sqlite3 libgtest-dev libgmock-dev libbenchmark-dev
  libeigen3-dev nlohmann-json3-dev libcli11-dev libfmt-dev libopenblas-dev
  libopenmpi-dev openmpi-bin
  libpcre2-dev libutf8proc-dev
  python3
)
# Tests only (SLIDEDP_TEST_DEPS=0 skips it, as the quickstart does): regenerates tests/data/step_golden
# in ctest (StepGoldens.Regenerate) to prove the committed files come from
# scripts/golden/make_step_goldens.py: ~80 s and ~600 MiB (178 packages) on Debian 12.
# python3-jinja2: the reference renderer of the chat-template agreement test (transformers renders with it).
# clang-format and clang-tidy: scripts/style_check.sh, which the test command runs on the changed files
# (clang-tidy-19 for the .cu files: the default 14 cannot parse CUDA 12+'s headers).
if [ "${SLIDEDP_TEST_DEPS:-1}" = "1" ]; then packages+=(python3-torch python3-jinja2 clang-format clang-tidy clang-tidy-19); fi
# Fuzzing campaigns only (scripts/fuzz.sh sets it): clang with libFuzzer and the sanitizer runtimes.
if [ "${SLIDEDP_FUZZ_DEPS:-0}" = "1" ]; then packages+=(clang libclang-rt-dev); fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
echo "install_deps: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"

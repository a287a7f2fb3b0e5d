#!/usr/bin/env bash
# check-config.sh CONFIG PROGRAM [ARGS...]
#
# The build-time half of a holdfast daemon's config check, run by the NixOS
# modules in a runCommand: `PROGRAM check --config COPY ARGS...` on a copy of
# CONFIG (a generated TOML file) in which every `*_file = "PATH"` whose PATH
# does not exist here (keys and certificates live in /etc/holdfast/tls or
# $CREDENTIALS_DIRECTORY, never in the Nix store, so never in the build
# sandbox) points at a throwaway stand-in instead: a fresh self-signed
# certificate for cert_file/ca_file/client_ca_file, its key for key_file, a
# one-line file (0600) for any other secret. Everything else in the file is
# checked as written. The unit's ExecStartPre= runs the same check on the
# real files before every start.
set -euo pipefail
config=$1
program=$2
shift 2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
umask 077

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
  -keyout "$work/stand-in-key.pem" -out "$work/stand-in.pem" -days 2 \
  -subj /CN=holdfast-build-check \
  -addext "subjectAltName=URI:spiffe://holdfast-build-check.invalid/check" 2>/dev/null
echo stand-in >"$work/stand-in-secret"

copy="$work/$(basename "$config")"
re='^([[:space:]]*)([A-Za-z0-9_]*_file)[[:space:]]*=[[:space:]]*"([^"]*)"[[:space:]]*$'
while IFS= read -r line || [ -n "$line" ]; do
  if [[ $line =~ $re ]] && [ ! -e "${BASH_REMATCH[3]}" ]; then
    indent=${BASH_REMATCH[1]} key=${BASH_REMATCH[2]} path=${BASH_REMATCH[3]}
    case $key in
      key_file) stand_in="$work/stand-in-key.pem" ;;
      cert_file | ca_file | client_ca_file) stand_in="$work/stand-in.pem" ;;
      *) stand_in="$work/stand-in-secret" ;;
    esac
    echo "check-config: $key = \"$path\" is not in the build sandbox; checking with a stand-in (ExecStartPre= checks the real file)" >&2
    printf '%s%s = "%s"\n' "$indent" "$key" "$stand_in"
  else
    printf '%s\n' "$line"
  fi
done <"$config" >"$copy"

"$program" check --config "$copy" "$@"

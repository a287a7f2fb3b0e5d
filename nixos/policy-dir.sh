#!/usr/bin/env bash
# policy-dir.sh CLASSES_TOML GRANTS_TOML|- OUT
#
# Builds the controller's policy directory from the TOML files the module
# generates with pkgs.formats.toml: OUT/classes.d/nixos.toml and (unless
# GRANTS_TOML is -) OUT/grants.d/nixos.toml. pkgs.formats.toml cannot write
# a TOML date, and the controller refuses a quoted waiver_expires, so
# `waiver_expires = "YYYY-MM-DD"` becomes `waiver_expires = YYYY-MM-DD`.
set -euo pipefail
classes=$1
grants=$2
out=$3
mkdir -p "$out/classes.d" "$out/grants.d"
sed -E 's/^([[:space:]]*waiver_expires[[:space:]]*=[[:space:]]*)"([0-9]{4}-[0-9]{2}-[0-9]{2})"[[:space:]]*$/\1\2/' \
  "$classes" >"$out/classes.d/nixos.toml"
if [ "$grants" != - ]; then
  cp "$grants" "$out/grants.d/nixos.toml"
fi

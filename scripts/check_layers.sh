#!/usr/bin/env bash
# scripts/check_layers.sh -- fails when a target depends on a layer above it (docs/architecture.md,
# "Layers"). Each rule names targets and what they must never reach, directly or through others;
# a broken rule prints one dependency path that breaks it. scripts/test.sh runs it.
#
#   usage: scripts/check_layers.sh
set -uo pipefail
cd "$(dirname "$0")/.."

# rule NAME FROM FORBIDDEN: no target in FROM may depend on any target in FORBIDDEN.
failures=0
rule() {
  local name=$1 from=$2 forbidden=$3 hits err
  err=$(mktemp)
  if ! hits=$(bazel query --noshow_progress --noshow_loading_progress \
    "deps(${from}) intersect (${forbidden})" 2>"${err}"); then
    echo "check_layers: bazel query failed for '${name}':"
    cat "${err}"
    rm -f "${err}"
    failures=$((failures + 1))
    return
  fi
  rm -f "${err}"
  if [ -n "${hits}" ]; then
    echo "check_layers: FAILED ${name}: ${from} reaches:"
    echo "${hits}" | sed 's/^/    /'
    echo "  one path:"
    bazel query --noshow_progress --noshow_loading_progress \
      "somepath(${from}, ${forbidden})" 2>/dev/null | sed 's/^/    /'
    failures=$((failures + 1))
  else
    echo "check_layers: ok ${name}"
  fi
}

readonly herd_above_client='//herd:engine + //herd/replication/... + //herd:response_gate'
rule "the wire format is the bottom of herd" \
  '//herd:wire' "${herd_above_client} + //herd:client + //herd:datapath"
rule "the data path knows no protocol, store or engine" \
  '//herd:datapath' "${herd_above_client} + //herd:client + //herd:wire + //mica/..."
rule "an embedded client links no server and no replication" \
  '//herd:client' "${herd_above_client}"
rule "replication sits below the engine and links no client" '//herd/replication/...' \
  '//herd:engine + //herd:client'
rule "the replication member runs over ReplicationHost alone (its test links no server)" \
  '//tests/herd:replication_member_test' '//herd:engine + //herd:client'
rule "the examples link the client library, nothing of the server" \
  '//examples:kv_client + //examples:batch_client' "${herd_above_client}"
rule "the echo baseline shares only the data path and the wire, never the store" \
  '//bench:echo_server + //bench:echo_client' "${herd_above_client} + //herd:client + //mica:mica"
rule "mica knows nothing of herd or the transport" '//mica/...' '//herd/... + //transport/...'
rule "the transport knows nothing of herd or mica" '//transport/...' '//herd/... + //mica/...'
rule "hopscotch uses neither mica nor herd" '//hopscotch/...' '//herd/... + //mica/...'
rule "rmem uses neither mica nor herd" '//rmem/...' '//herd/... + //mica/...'
rule "the rmem client does not link the server's pool" '//rmem:client + //rmem:shadow' '//rmem:pool'

if [ "${failures}" -gt 0 ]; then
  echo "check_layers: ${failures} rule(s) broken"
  exit 1
fi
echo "check_layers: every rule holds"

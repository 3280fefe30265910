# scripts/lib/run_herd.sh -- sourced by the Soft-RoCE side-by-side scripts (rxe_side_by_side.sh,
# original_herd_rxe.sh): one herd run, a server and its client, with results in files.
#
#   run_herd_once NAME OUT_DIR BIN_ROOT SERVER_ARGS CLIENT_ARGS
#
# SERVER_ARGS and CLIENT_ARGS name bash arrays (passed by name). Starts
# BIN_ROOT/herd/herd_server --port=0 with the server's arguments, reads the port from its ready
# line, runs BIN_ROOT/bench/herd_client against it, then stops the server. Leaves
# OUT_DIR/NAME.json (the client's JSON line), NAME.server.json (the server's final stats),
# NAME.server.log and NAME.client.log. Returns 1 when the client measured no operation (it
# failed, or served nothing): a run that did nothing must not pass for a result.
run_herd_once() {
  local name=$1 out_dir=$2 root=$3 fifo ready port server
  local -n run_herd_server_args=$4 run_herd_client_args=$5
  fifo=$(mktemp -u) && mkfifo "$fifo"
  "$root/herd/herd_server" --port=0 "${run_herd_server_args[@]}" >"$fifo" \
    2>"$out_dir/$name.server.log" &
  server=$!
  exec 3<"$fifo"
  read -r ready <&3
  rm -f "$fifo"
  port=${ready#*port=}
  port=${port%% *}
  "$root/bench/herd_client" --server="127.0.0.1:$port" "${run_herd_client_args[@]}" \
    2>"$out_dir/$name.client.log" | tail -n 1 >"$out_dir/$name.json"
  kill -TERM "$server"
  cat <&3 >"$out_dir/$name.server.json"
  wait "$server" || true
  exec 3<&-
  if ! /usr/bin/python3 -c 'import json, sys
sys.exit(0 if json.load(open(sys.argv[1])).get("ops", 0) > 0 else 1)' "$out_dir/$name.json" \
    2>/dev/null; then
    echo "run_herd_once: $name measured no operation (see $out_dir/$name.client.log)" >&2
    return 1
  fi
}

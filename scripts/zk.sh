#!/usr/bin/env bash
# scripts/zk.sh -- a private ZooKeeper for herd's replicated clusters (issue 35): one standalone
# server on loopback, its data, log and pid in a folder of the caller's. Never Debian's system
# service: tests and scripts each start their own and stop it.
#
#   scripts/zk.sh start DIR [PORT]   starts one (PORT 0 or none: a free one); prints host:port
#   scripts/zk.sh stop DIR           stops it (SIGTERM, then SIGKILL)
#   scripts/zk.sh kill DIR           SIGKILL: a crash (its data stays: start again to recover)
#   scripts/zk.sh address DIR        prints host:port of the one started in DIR
#
# With HERD_ZK_OWNER=PID in the environment, the server is killed when process PID ends. With
# HERD_ZK_ADDRESS=IP it listens there (one of this host's addresses, for servers on other hosts)
# instead of on 127.0.0.1. (HERD_ZK_EXEC_DELAY_S, for tests/scripts/zk_test.py: the forked shell
# waits that long before it becomes the server, as a loaded machine may make it.)
#
# Needs Debian's zookeeper package (scripts/setup.sh installs it).
set -euo pipefail

# ZooKeeper's tick: sessions may last 2 to 200 ticks. 100 ms lets tests use sessions of 0.4 s.
TICK_MS=100
READY_TIMEOUT_S=60
JAR=/usr/share/java/zookeeper.jar

die() { echo "zk.sh: $*" >&2; exit 1; }

serving() {  # serving HOST PORT: the four-letter "srvr" reports a mode (standalone, leader...)
  # Not "ruok": it answers "imok" once the port is bound, before the server serves; a session
  # asked for then is refused (the client's EHOSTDOWN), and on a loaded machine that window lasts
  # long enough for a test's first request to time out.
  local reply
  reply=$(timeout 1 bash -c "exec 3<>/dev/tcp/$1/$2 && echo srvr >&3 && cat <&3" 2>/dev/null) ||
    return 1
  [[ "$reply" == *"Mode: "* ]]
}

pid_of() { [ -s "$1/zk.pid" ] && cat "$1/zk.pid"; }

start() {
  local dir=$1 port=${2:-0} address=${HERD_ZK_ADDRESS:-127.0.0.1}
  [ -f "$JAR" ] || die "$JAR missing: run scripts/setup.sh (Debian's zookeeper package)"
  command -v java >/dev/null || die "java missing: run scripts/setup.sh"
  mkdir -p "$dir/data"
  dir=$(cd "$dir" && pwd)
  local pid
  if pid=$(pid_of "$dir") && kill -0 "$pid" 2>/dev/null; then
    die "one is running in $dir already (pid $pid)"
  fi
  if [ "$port" = 0 ]; then
    port=$(python3 -c 'import socket, sys; s=socket.socket(); s.bind((sys.argv[1], 0)); print(s.getsockname()[1])' "$address")
  fi
  cat >"$dir/zoo.cfg" <<EOF
tickTime=$TICK_MS
dataDir=$dir/data
clientPort=$port
clientPortAddress=$address
minSessionTimeout=$((2 * TICK_MS))
maxSessionTimeout=$((200 * TICK_MS))
admin.enableServer=false
4lw.commands.whitelist=ruok,stat,srvr
EOF
  echo "$address:$port" >"$dir/address"
  local delay=${HERD_ZK_EXEC_DELAY_S:-0}
  (
    [ "$delay" = 0 ] || sleep "$delay"
    exec setsid java -Xmx256m -cp "/etc/zookeeper/conf:$JAR" -Dzookeeper.log.dir="$dir" \
      org.apache.zookeeper.server.ZooKeeperServerMain "$dir/zoo.cfg" >"$dir/zk.log" 2>&1 </dev/null
  ) &
  echo $! >"$dir/zk.pid"
  if [ -n "${HERD_ZK_OWNER:-}" ]; then
    # A test's: it goes when its owner process does, however that ends (a crash included). The
    # watcher names this server's pid, never the folder's pid file: a restart's new server is its
    # own watcher's.
    local java_pid
    java_pid=$(pid_of "$dir")
    ours() { tr '\0' ' ' <"/proc/$java_pid/cmdline" 2>/dev/null | grep -qF "$dir/zoo.cfg"; }
    (
      trap '' HUP
      # Until the forked shell has become java, its command line is this script's, not the
      # server's: a watcher that looked then took the server for gone, and killed it the moment
      # it started (a loaded machine's failed starts: "Killed", nothing logged).
      while ! ours && kill -0 "$java_pid" 2>/dev/null; do sleep 0.05; done
      while kill -0 "$HERD_ZK_OWNER" 2>/dev/null && ours; do sleep 1; done
      if ours; then kill -KILL "$java_pid" 2>/dev/null || true; fi
    ) </dev/null >/dev/null 2>&1 &
    disown
  fi
  local deadline=$((SECONDS + READY_TIMEOUT_S))
  until serving "$address" "$port"; do
    kill -0 "$(pid_of "$dir")" 2>/dev/null ||
      die "ZooKeeper exited at start (port $port taken?): $(tail -5 "$dir/zk.log")"
    [ $SECONDS -lt $deadline ] || die "ZooKeeper did not serve on $address:$port in ${READY_TIMEOUT_S}s"
    sleep 0.05
  done
  echo "$address:$port"
}

stop() {
  local dir=$1 signal=${2:-TERM} pid
  pid=$(pid_of "$dir") || return 0
  kill -"$signal" "$pid" 2>/dev/null || true
  for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
  kill -KILL "$pid" 2>/dev/null || true
  rm -f "$dir/zk.pid"
}

case "${1:-}" in
  start) [ $# -ge 2 ] || die "usage: zk.sh start DIR [PORT]"; start "$2" "${3:-0}" ;;
  stop) [ $# -eq 2 ] || die "usage: zk.sh stop DIR"; stop "$2" TERM ;;
  kill) [ $# -eq 2 ] || die "usage: zk.sh kill DIR"; stop "$2" KILL ;;
  address) [ $# -eq 2 ] || die "usage: zk.sh address DIR"; cat "$2/address" ;;
  *) die "usage: zk.sh start|stop|kill|address DIR [PORT]" ;;
esac

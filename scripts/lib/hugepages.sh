# scripts/lib/hugepages.sh -- sourced: 2 MiB hugepages for one run.
#
#   lend_hugepages PAGES WHAT    at the start (WHAT names the run in what it prints)
#   give_back_hugepages          from the caller's EXIT trap
#
# MICA's partitions are meant for 2 MiB pages: on 4 KiB ones nearly every random bucket and item
# access also misses the TLB (in a VM, a two-level page walk), and a benchmark then measures the
# page walks. The kernel's pool is empty by default. As root, when fewer than PAGES are free,
# lend_hugepages grows the pool by what is missing, and give_back_hugepages shrinks it by what
# it added (pages still in use are freed as their users let go). Not root, or a kernel that
# grants fewer: it says so and the run goes on, on whatever pages it gets (herd falls back to
# small pages by itself, and says so); a run never fails for want of hugepages.
hugepages_pool=/proc/sys/vm/nr_hugepages
hugepages_meminfo=/proc/meminfo  # (both paths are the kernel's; tests point them at files)
hugepages_lent=0

lend_hugepages() {
  local want=$1 what=$2 free total why
  # Free counts the pages some mapping reserved and has not touched yet: not free for this run.
  free=$(awk '/^HugePages_Free:/ {f = $2} /^HugePages_Rsvd:/ {r = $2} END {print f - r}' \
    "$hugepages_meminfo")
  free=${free:-0}
  [ "$free" -lt "$want" ] || return 0
  if [ "$(id -u)" != 0 ] || [ ! -w "$hugepages_pool" ]; then
    why="only root can add more"
    [ "$(id -u)" != 0 ] || why="${hugepages_pool} is read-only here"
    echo "[hugepages] ${what}: ${free} of the ${want} 2 MiB pages it wants are free and ${why}:" \
      "it runs on 4 KiB pages where they run out (TLB misses)" >&2
    return 0
  fi
  total=$(cat "$hugepages_pool")
  echo $((total + want - free)) >"$hugepages_pool" 2>/dev/null || true
  hugepages_lent=$(($(cat "$hugepages_pool") - total))
  [ "$hugepages_lent" -ge 0 ] || hugepages_lent=0
  if [ $((free + hugepages_lent)) -lt "$want" ]; then
    echo "[hugepages] ${what}: the kernel granted ${hugepages_lent} of the $((want - free))" \
      "pages of 2 MiB asked (${want} wanted): it runs on 4 KiB pages where they run out" >&2
  else
    echo "[hugepages] ${what}: lent the kernel's pool ${hugepages_lent} pages of 2 MiB for" \
      "this run" >&2
  fi
}

give_back_hugepages() {
  [ "$hugepages_lent" -gt 0 ] || return 0
  local total
  total=$(cat "$hugepages_pool")
  echo $((total > hugepages_lent ? total - hugepages_lent : 0)) >"$hugepages_pool" 2>/dev/null ||
    true
  hugepages_lent=0
}

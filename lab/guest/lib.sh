# Helpers sourced by every suite script (/lab/suites/<suite>.sh) in the guest.
# wait_listen PORT [ADDR]: wait (max 10 s) until an rdma_cm id listens on PORT (on ADDR).
wait_listen() {
  i=0
  while [ $i -lt 100 ]; do
    # e.g. "link rxe0/1 cm-idn 0 state LISTEN ps TCP pid 129 comm cmtime src-addr 10.0.0.1:7471 ..."
    /usr/sbin/rdma resource show cm_id 2>/dev/null | grep -q "state LISTEN .* src-addr ${2:-[^ ]*}:$1 " && return 0
    usleep 100000; i=$((i + 1))
  done
  echo "lab: nothing listening on ${2:+$2:}port $1 after 10 s"; /usr/sbin/rdma resource show cm_id
  return 1
}
# wait_pid PID SECS: wait for a background process, kill it after SECS (rc 1).
wait_pid() {
  i=0
  while kill -0 "$1" 2>/dev/null; do
    [ $i -ge $(($2 * 10)) ] && { kill -9 "$1" 2>/dev/null; return 1; }
    usleep 100000; i=$((i + 1))
  done
  wait "$1"
}

# --- the pair topology (boot group "pair", kernel command line lab.topology=pair) -----------
# Two rxe devices in one kernel: rxe0 on veth0 and rxe1 on veth1, joined by the veth pair.
# PAIRS address pairs (/lab/config); pair K is A = 10.0.K.1 on veth0 (rxe0) and B = 10.0.K.2
# on veth1 (rxe1). Bind both ends (-b A / -b B): only traffic between a pair's own two
# addresses goes over the wire (guest/init, pair_net); an unbound client resolves B through
# the local table, lands on rxe1 and loops back there (measured), unseen by the hook.
# Directions: ab = A -> B (sent by rxe0, arrives on veth1), ba = B -> A (sent by rxe1).
# Kinds (the IB CM's names, as in sysfs's cm_tx_msgs/): req mra rej rep rtu dreq drep
# sidr_req sidr_rep lap apr.
#
# Every CM MAD (UDP dport 4791, BTH dest QP 1, management class 0x07) of a pair crosses the
# prerouting hook of nft table `ip cm_fault` on its way in (the receiving veth), where it is
# counted and logged, then passes through that pair's drop chain:
#   chain wire      base chain (prerouting, priority raw): jump cut, then CM MADs jump cm
#   chain cut       empty: your own rules for whole-packet cuts, e.g. a partition of pair 2:
#                     nft add rule ip cm_fault cut ip saddr 10.0.2.1 ip daddr 10.0.2.2 drop
#                   (every RoCEv2 packet, CM or data, reaches it; cm_undrop flushes it)
#   chain cm        vmap on (saddr, daddr) -> pK_ab / pK_ba
#   chain pK_DIR    one rule per kind: counter pK_DIR_KIND + log "cm-wire pK DIR KIND ", then
#                   jump pK_DIR_drop
#   chain pK_DIR_drop  the rules cm_drop adds (counter pK_DIR_KIND_drop)
# Why prerouting on the receiving side, not output: a packet dropped in the sender's output or
# postrouting hook (or a netdev egress hook) makes ip_local_out fail, and rxe then rolls the
# work request back and sends the very packet again (rxe_req.c, -EAGAIN): that would be no loss
# at all. Past the veth, the sender has long been told the packet left.

# pair_addrs K: "A B", the K-th pair's addresses (A on veth0/rxe0, B on veth1/rxe1).
pair_addrs() { echo "10.0.$1.1 10.0.$1.2"; }

CM_TABLE=cm_fault
CM_KINDS="req mra rej rep rtu dreq drep sidr_req sidr_rep lap apr"

# cm_attr KIND: the MAD attribute id of a CM message kind (ib_cm.h), e.g. req -> 0x0010.
cm_attr() {
  case $1 in
    req) echo 0x0010 ;; mra) echo 0x0011 ;; rej) echo 0x0012 ;; rep) echo 0x0013 ;;
    rtu) echo 0x0014 ;; dreq) echo 0x0015 ;; drep) echo 0x0016 ;; sidr_req) echo 0x0017 ;;
    sidr_rep) echo 0x0018 ;; lap) echo 0x0019 ;; apr) echo 0x001a ;;
    *) echo "lab: unknown CM kind '$1'" >&2; return 1 ;;
  esac
}

# cm_table_setup: (re)creates table ip cm_fault for pairs 0..PAIRS-1 (guest/init calls it).
# On the wire the MAD starts 20 bytes into the UDP payload (BTH 12 + DETH 8), so in bits from
# the UDP header (@th): BTH dest QP at 104 (24 bits), MAD class at 232 (8), attribute id at 352
# (16). Chains are declared before the chains that jump to them.
cm_table_setup() {
  k=0 f=/tmp/cm_fault.nft
  {
    echo "table ip $CM_TABLE {"
    while [ $k -lt "$PAIRS" ]; do
      for d in ab ba; do
        for m in $CM_KINDS; do echo "  counter p${k}_${d}_$m { }"; echo "  counter p${k}_${d}_${m}_drop { }"; done
        echo "  chain p${k}_${d}_drop { }"
        echo "  chain p${k}_$d {"
        for m in $CM_KINDS; do
          echo "    @th,352,16 $(cm_attr $m) counter name \"p${k}_${d}_$m\" log prefix \"cm-wire p$k $d $m \""
        done
        echo "    jump p${k}_${d}_drop"
        echo "  }"
      done
      k=$((k + 1))
    done
    echo "  chain cut { }"
    echo "  chain cm {"
    printf '    ip saddr . ip daddr vmap {'
    k=0 sep=" "
    while [ $k -lt "$PAIRS" ]; do
      set -- $(pair_addrs $k)
      printf '%s%s . %s : jump p%s_ab, %s . %s : jump p%s_ba' "$sep" "$1" "$2" $k "$2" "$1" $k
      k=$((k + 1)) sep=", "
    done
    echo " }"
    echo "  }"
    echo "  chain wire {"
    echo "    type filter hook prerouting priority raw; policy accept;"
    echo "    udp dport 4791 jump cut"
    echo "    udp dport 4791 @th,104,24 1 @th,232,8 0x07 jump cm"
    echo "  }"
    echo "}"
  } > $f
  nft delete table ip $CM_TABLE 2>/dev/null
  nft -f $f
}

# cm_drop K DIR KIND WHICH: drop CM messages of KIND on pair K in direction DIR (ab|ba).
# WHICH: all, or N, or N-M: the N-th (0-based) to M-th message of that kind the rule sees,
# counted from when the rule was added (every transmission: retries and duplicates count).
# Each call adds a rule (with its own count); cm_undrop removes them.
cm_drop() {
  a=$(cm_attr "$3") || return 1
  case $4 in
    all) sel="" ;;
    *[!0-9-]*|"") echo "lab: cm_drop: WHICH is all, N or N-M, not '$4'" >&2; return 1 ;;
    *) sel="numgen inc mod 1000000 $4" ;;
  esac
  nft add rule ip $CM_TABLE "p$1_$2_drop" @th,352,16 "$a" $sel counter name "\"p$1_$2_$3_drop\"" \
    log prefix "\"cm-drop p$1 $2 $3 \"" drop
}

# cm_undrop [K]: remove the drop rules of pair K (all pairs without K) and the cut chain's rules.
cm_undrop() {
  k=${1:-0} n=${1:-$((PAIRS - 1))}
  while [ "$k" -le "$n" ]; do
    nft flush chain ip $CM_TABLE "p${k}_ab_drop" && nft flush chain ip $CM_TABLE "p${k}_ba_drop" || return 1
    k=$((k + 1))
  done
  [ -n "$1" ] || nft flush chain ip $CM_TABLE cut
}

# cm_count K DIR KIND [seen|dropped]: how many KIND messages of pair K, direction DIR, reached
# the hook (seen, the default: every transmission) or were dropped there, since the last
# cm_reset. Passed on = seen - dropped.
# One nft call each (some 0.1-0.2 s under TCG): for many counters use cm_counts.
cm_count() {
  c=p$1_$2_$3; [ "${4:-seen}" = dropped ] && c=${c}_drop
  nft list counter ip $CM_TABLE "$c" | awk '$1 == "packets" { print $2; found = 1 } END { if (!found) exit 1 }'
}

# cm_counts: every counter of the table in one nft call, one line "K DIR KIND SEEN DROPPED" per
# pair, direction and kind, sorted.
cm_counts() {
  nft list counters table ip $CM_TABLE | awk '
    $1 == "counter" { name = $2 } $1 == "packets" { v[name] = $2 }
    END {
      for (n in v) {
        if (n ~ /_drop$/) continue
        k = n; sub(/^p/, "", k); sub(/_.*/, "", k)
        d = n; sub(/^p[0-9]+_/, "", d); m = d; sub(/_.*/, "", d); sub(/^[ab]+_/, "", m)
        print k, d, m, v[n], v[n "_drop"]
      }
    }' | sort
}

# cm_reset: every nft counter to 0, every drop rule removed (cm_undrop), the wire log cleared.
cm_reset() {
  cm_undrop && nft reset counters table ip $CM_TABLE > /dev/null && dmesg -c > /dev/null
}

# cm_wire: the CM messages that reached the hook since the last cm_reset, one line each, in
# order: "T pK DIR KIND seen|dropped" with T the kernel's timestamp (seconds since boot, us
# resolution). A dropped message has a "seen" line and then a "dropped" one.
# (The kernel log holds 128 KiB, some 600 lines: call cm_reset between patterns.)
cm_wire() {
  dmesg | sed -nE 's/^\[ *([0-9.]+)\] cm-(wire|drop) (p[0-9]+) ([ab]+) ([a-z_]+) .*/\1 \3 \4 \5 \2/p' |
    sed 's/ wire$/ seen/; s/ drop$/ dropped/'
}

# rxe_cm DEV GROUP KIND: the IB CM's counter of port 1 of DEV, GROUP one of cm_tx_msgs,
# cm_tx_retries, cm_rx_msgs, cm_rx_duplicates. Per device, so shared by every pair; the IB CM
# adds to the cm_tx_* ones when a send completes (the answer came, or the retries ran out), not
# when it leaves, and counts an answer it sends again to a duplicate (an RTU, a DREP) as 2
# messages and 1 retry (cm_send_handler).
rxe_cm() { cat "/sys/class/infiniband/$1/ports/1/$2/$3"; }
# rxe_cm_all: all of them, both devices, one line "DEV GROUP KIND VALUE" each (one grep).
rxe_cm_all() {
  grep -H . /sys/class/infiniband/rxe*/ports/1/cm_*/* | sed 's#^/sys/class/infiniband/\([^/]*\)/ports/1/\([^/]*\)/\([^:]*\):# \1 \2 \3 #; s/^ //'
}

# cm_gaps K DIR KIND: the gaps, in ms, between successive transmissions of KIND on pair K in
# direction DIR since the last cm_reset (from cm_wire), space separated; empty with fewer than
# two. The first gap of a REQ dropped once is the IB CM's retry interval.
cm_gaps() {
  cm_wire | awk -v k="p$1" -v d="$2" -v m="$3" '
    $2 == k && $3 == d && $4 == m && $5 == "seen" { if (n++) printf "%s%d", (n > 2 ? " " : ""), ($1 - t) * 1000 + 0.5; t = $1 }
    END { print "" }'
}

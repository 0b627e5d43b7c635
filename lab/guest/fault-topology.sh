# fault-topology: the pair topology's self-test (boot group pair; lab/README.md, "The pair
# topology"). lab.sh puts `. /lab/lib.sh` in front of it. It fails unless
#   a  an RDMA CM exchange between 10.0.0.1 (rxe0) and 10.0.0.2 (rxe1) works (rdma-core's
#      ucmatose: 1 connection, 10 messages each way);
#   b  the nft counters of pair 0 see its REQ, REP, RTU, DREQ and DREP, each in its direction,
#      and agree with rxe's own counters (every kind: what rxe0 sent is what the hook saw from
#      A, what rxe1 received is what passed it, and the reverse);
#   c  with the first REQ dropped the connection still completes, rxe0's cm_tx_retries/req
#      shows the retry, and the retry's delay is printed (6.1's arithmetic: 6144 ms);
#   d  on pairs 1 and 0 at once, pair 1 losing its first REQ and pair 0 its first REP: both
#      complete, each pair's counters show only its own loss (the REP's retry delay printed,
#      4096 ms by the arithmetic), rxe's per-device counters the sum;
#   e  a rule in the cut chain stops every packet of pair 2 before the CM counters see it.
# Times are printed, never judged (TCG). Every fact is a line "fault-topology: ..." for later
# suites to grep; the last is "fault-topology: ok" or "fault-topology: FAILED (N checks)".
fails=0
say() { echo "fault-topology: $*"; }
bad() { say "FAIL $*"; fails=$((fails + 1)); }
GROUPS_="cm_tx_msgs cm_tx_retries cm_rx_msgs cm_rx_duplicates"

# Each nft call or fork costs tens of ms under TCG, so the counters are read in bulk, once per
# phase, into shell variables: D_<dev>_<group>_<kind> (how much rxe's counter grew since
# begin), N_<K>_<dir>_<kind> and X_<K>_<dir>_<kind> (the hook's seen and dropped counts).
begin() { cm_reset && rxe_cm_all > /tmp/sys.before; }
collect() {
  usleep 1000000   # the IB CM adds to cm_tx_* when a send completes: let the last ones complete
  rxe_cm_all > /tmp/sys.after
  eval "$(awk 'NR == FNR { b[$1 " " $2 " " $3] = $4; next }
               { print "D_" $1 "_" $2 "_" $3 "=" ($4 - b[$1 " " $2 " " $3]) }' /tmp/sys.before /tmp/sys.after)"
  eval "$(cm_counts | awk '{ print "N_" $1 "_" $2 "_" $3 "=" $4 "; X_" $1 "_" $2 "_" $3 "=" $5 }')"
}
d_() { eval echo \${D_$1_$2_$3:-x}; }          # d_ DEV GROUP KIND
n_() { eval echo \${N_$1_$2_$3:-x}; }          # n_ K DIR KIND  (seen)
x_() { eval echo \${X_$1_$2_$3:-x}; }          # x_ K DIR KIND  (dropped)

# start K: ucmatose server on pair K's B, then its client from A, both in the background.
start() {
  set -- $1 $(pair_addrs $1)
  ucmatose -b $3 -c 1 -C 10 > /tmp/server.$1 2>&1 &
  eval srv_$1=$!
  wait_listen 7471 $3 || { cat /tmp/server.$1; return 1; }
  timeout 40 ucmatose -s $3 -b $2 -c 1 -C 10 > /tmp/client.$1 2>&1 &
  eval cli_$1=$!
}
# finish K TAG: wait (bounded) for both ends of pair K; both must exit 0.
finish() {
  eval c=\$cli_$1 s=\$srv_$1
  wait_pid $c 45; crc=$?
  wait_pid $s 10; src=$?
  set -- $1 $2 $(pair_addrs $1)
  say "$2 exchange p$1 $3 -> $4: client rc $crc, server rc $src"
  if [ $crc != 0 ] || [ $src != 0 ]; then
    bad "$2: ucmatose on pair $1 failed"
    sed "s/^/  client: /" /tmp/client.$1; sed "s/^/  server: /" /tmp/server.$1
  fi
}

# wire TAG K: the hook's counts of pair K, one line per direction, kinds with a count only.
wire() {
  for d in ab ba; do
    line=""
    for m in $CM_KINDS; do
      n=$(n_ $2 $d $m) x=$(x_ $2 $d $m)
      [ "$n" = x ] && { bad "$1: no counter p$2 $d $m"; continue; }
      [ "$n" != 0 ] && line="$line $m=$n" && [ "$x" != 0 ] && line="$line(dropped $x)"
    done
    say "$1 wire p$2 $d:${line:- none}"
  done
}
# sysfs TAG: what rxe's counters grew by, non-zero kinds only, one line per device and group.
sysfs() {
  for d in rxe0 rxe1; do
    for g in $GROUPS_; do
      line=""
      for m in $CM_KINDS; do v=$(d_ $d $g $m); [ "$v" != 0 ] && line="$line $m=$v"; done
      say "$1 sysfs $d $g:${line:- none}"
    done
  done
}
# agree TAG K...: for every kind, rxe0's cm_tx_msgs grew by what the hook saw from A on the
# pairs K (ab), rxe1's cm_rx_msgs by what passed (ab less dropped), and the reverse for ba.
agree() {
  tag=$1; shift
  for m in $CM_KINDS; do
    ab=0 abx=0 ba=0 bax=0
    for k in "$@"; do
      ab=$((ab + $(n_ $k ab $m))) abx=$((abx + $(x_ $k ab $m)))
      ba=$((ba + $(n_ $k ba $m))) bax=$((bax + $(x_ $k ba $m)))
    done
    t0=$(d_ rxe0 cm_tx_msgs $m) r1=$(d_ rxe1 cm_rx_msgs $m)
    t1=$(d_ rxe1 cm_tx_msgs $m) r0=$(d_ rxe0 cm_rx_msgs $m)
    [ "$t0" = $ab ] || bad "$tag $m: rxe0 sent $t0, the hook saw $ab from A"
    [ "$r1" = $((ab - abx)) ] || bad "$tag $m: rxe1 received $r1, $((ab - abx)) passed the hook"
    [ "$t1" = $ba ] || bad "$tag $m: rxe1 sent $t1, the hook saw $ba from B"
    [ "$r0" = $((ba - bax)) ] || bad "$tag $m: rxe0 received $r0, $((ba - bax)) passed the hook"
  done
}
# expect TAG K DIR KIND SEEN DROPPED
expect() {
  n=$(n_ $2 $3 $4) x=$(x_ $2 $3 $4)
  [ "$n" = "$5" ] || bad "$1: p$2 $3 $4 seen $n times, expected $5"
  [ "$x" = "$6" ] || bad "$1: p$2 $3 $4 dropped $x times, expected $6"
}
# grew TAG DEV GROUP KIND N: rxe's counter grew by N.
grew() {
  v=$(d_ $2 $3 $4); [ "$v" = "$5" ] || bad "$1: $2 $3/$4 grew by $v, expected $5"
}
# delay TAG K DIR KIND KERNEL_MS: prints the measured retry delay (never judged).
delay() {
  g=$(cm_gaps $2 $3 $4)
  say "$1 retry p$2 $3 $4 after ${g:-?} ms (kernel arithmetic: $5 ms)"
  [ -n "$g" ] || bad "$1: no second transmission of p$2 $3 $4 on the wire"
}

say "pairs $PAIRS: $(k=0; while [ $k -lt $PAIRS ]; do printf '%s ' "p$k=$(pair_addrs $k | tr ' ' '/')"; k=$((k + 1)); done)"
for d in rxe0 rxe1; do
  say "gids $d: $(cat /sys/class/infiniband/$d/ports/1/gids/* | grep -c ':ffff:') IPv4-mapped"
done
set -- $(pair_addrs 0)
say "route p0 ab: $(/usr/sbin/ip route get $2 from $1 | head -n 1)"
say "route p0 ba: $(/usr/sbin/ip route get $1 from $2 | head -n 1)"

# --- a, b: one exchange on pair 0, every message counted ------------------------------------
begin
start 0 && finish 0 a
collect
wire a 0; sysfs a
expect a 0 ab req 1 0; expect a 0 ba rep 1 0; expect a 0 ab rtu 1 0
[ $(($(n_ 0 ab dreq) + $(n_ 0 ba dreq))) -ge 1 ] || bad "a: no DREQ on the wire"
[ $(($(n_ 0 ab drep) + $(n_ 0 ba drep))) -ge 1 ] || bad "a: no DREP on the wire"
agree a 0
grew a rxe0 cm_tx_retries req 0
say "a wire log:"; cm_wire | sed 's/^/  /'

# --- c: the first REQ of pair 0 dropped ------------------------------------------------------
begin
cm_drop 0 ab req 0 || bad "c: cm_drop failed"
start 0 && finish 0 c
collect
wire c 0; sysfs c
expect c 0 ab req 2 1; expect c 0 ba rep 1 0
grew c rxe0 cm_tx_retries req 1
agree c 0
delay c 0 ab req 6144
say "c wire log:"; cm_wire | sed 's/^/  /'

# --- d: pairs 1 and 0 at once, each with its own loss ----------------------------------------
begin
cm_drop 1 ab req 0 && cm_drop 0 ba rep 0 || bad "d: cm_drop failed"
start 1 && start 0
finish 1 d; finish 0 d
collect
wire d 1; wire d 0; sysfs d
expect d 1 ab req 2 1; expect d 1 ba rep 1 0
expect d 0 ab req 1 0; expect d 0 ba rep 2 1
grew d rxe0 cm_tx_retries req 1
grew d rxe1 cm_tx_retries rep 1
agree d 0 1
delay d 1 ab req 6144
delay d 0 ba rep 4096
say "d wire log:"; cm_wire | sed 's/^/  /'

# --- e: the cut chain, pair 2 --------------------------------------------------------------
begin
set -- $(pair_addrs 2)
nft add rule ip $CM_TABLE cut ip saddr $1 ip daddr $2 counter drop &&
  nft add rule ip $CM_TABLE cut ip saddr $2 ip daddr $1 counter drop || bad "e: nft add rule cut failed"
ucmatose -b $2 -c 1 -C 10 > /tmp/server.2 2>&1 &
srv=$!
wait_listen 7471 $2 || bad "e: no listener on $2"
timeout 3 ucmatose -s $2 -b $1 -c 1 -C 10 > /tmp/client.2 2>&1
crc=$?
kill $srv 2>/dev/null; wait_pid $srv 5
cut=$(nft list chain ip $CM_TABLE cut | awk '/counter packets/ { for (i = 1; i < NF; i++) if ($i == "packets") n += $(i + 1) } END { print n + 0 }')
collect
say "e cut p2: client rc $crc (stopped after 3 s), $cut packets cut, the hook's CM counters p2 ab req $(n_ 2 ab req), rxe1 received req $(d_ rxe1 cm_rx_msgs req)"
[ "$cut" -ge 1 ] || bad "e: the cut rules saw nothing"
[ "$(n_ 2 ab req)" = 0 ] || bad "e: a REQ of pair 2 passed the cut"
grew e rxe1 cm_rx_msgs req 0
cm_undrop

if [ $fails = 0 ]; then say ok; else say "FAILED ($fails checks)"; exit 1; fi

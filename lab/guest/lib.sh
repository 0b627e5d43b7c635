# Helpers sourced by every suite script (/lab/suites/<suite>.sh) in the guest.
# wait_listen PORT: wait (max 10 s) until an rdma_cm id listens on PORT.
wait_listen() {
  i=0
  while [ $i -lt 100 ]; do
    # e.g. "link rxe0/1 cm-idn 0 state LISTEN ps TCP pid 129 comm cmtime src-addr 10.0.0.1:7471 ..."
    /usr/sbin/rdma resource show cm_id 2>/dev/null | grep -q "state LISTEN .* src-addr [^ ]*:$1 " && return 0
    usleep 100000; i=$((i + 1))
  done
  echo "lab: nothing listening on port $1 after 10 s"; /usr/sbin/rdma resource show cm_id
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

#!/usr/bin/env bash
# Soft-RoCE lab: boot a tiny Linux VM (Debian's kernel, busybox userland) under
# QEMU/TCG, bring up rdma_rxe on a veth netdev, run RDMA programs inside it and
# bring their output back over the serial console.  See lab/README.md.
#
#   lab/lab.sh [run|shell] [options]        (lab/lab.sh --help for the options)
#
# Why a VM at all: the host kernel has no RDMA and there is no usable KVM, so
# the only way to exercise real librdmacm/rdma_cm code paths is a guest kernel
# with rxe, emulated by TCG.  Everything here is plain bash + apt packages.

set -euo pipefail
shopt -s nullglob

# ------------------------------------------------------------------ settings --
LAB_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(dirname "$LAB_DIR")
CACHE=$LAB_DIR/cache            # kernel .deb + extracted vmlinux/modules (gitignored)
WORK=$LAB_DIR/work              # initramfs tree, console log, per-suite output (gitignored)
ROOT=$WORK/root                 # initramfs staging tree
OUT=$WORK/out                   # console log split per suite
CONSOLE_LOG=$WORK/console.log   # the console of the boot being followed (console_log GROUP)
MULTIARCH=x86_64-linux-gnu
# as_root: root directly, or through sudo.
# shellcheck source=../scripts/as-root.sh
. "$REPO/scripts/as-root.sh"

MODE=run
CONNECTIONS=1000
PROJECT=1                       # build and run the project's hw binaries
SANITY=1                        # rping + ucmatose before the benchmarks
ONLY=""                         # comma list of suite names to keep (empty: all)
EXTRA_BINS=()                   # --extra-bin 'PATH [ARGS...]'
GUEST_ENV=()                    # --env K=V, exported in the guest before the suites
ADDR=10.0.0.1                   # guest address on veth0; client and server both use it
ADDR6=fd00::1                   # its IPv6 address (added with nodad), for the IPv6 suites
ADDR6_GID=fd00:0000:0000:0000:0000:0000:0000:0001   # how rxe's GID table shows ADDR6
PAIRS=24                        # address pairs of the pair topology (10.0.K.1 <-> 10.0.K.2):
                                # faultdiff runs pattern K on pair K (23 patterns)
SHELL_TOPOLOGY=single           # which topology `shell` boots (--topology)
VM_MEM=2048
VM_SMP=2
BOOT_TIMEOUT=120                # qemu start -> @@LAB-RXE-READY, else the VM counts as dead
VM_TIMEOUT=""                   # each VM boot; default: boot bound + sum of its suites' bounds (+slack)
SHELL_TIMEOUT=7200              # `shell` mode is interactive but still bounded
BUILD_TIMEOUT=900               # all cargo invocations together
APT_TIMEOUT=900
VERBOSE=0
KERNEL_PKG=${LAB_KERNEL_PKG:-}  # default: what linux-image-amd64 depends on
CARGO_DIR=$REPO                 # where cargo builds the project binaries

# Modules we need; their load order is derived from the `depends=` field of each
# module's .modinfo, so a different kernel ABI needs no edits here.  crc32_generic
# is not a link-time dependency of rdma_rxe but rxe allocates the "crc32" shash at
# run time; configfs is a dependency of rdma_cm; veth provides the veth0/veth1 pair.
ROOT_MODULES="configfs crc32_generic rdma_rxe rdma_ucm veth"
# The pair topology's on top (modules-pair.load, loaded only there): nf_tables with the objref
# expression (rules that count into named counters, cm_count), the numgen expression (cm_drop's
# "the N-th message"), the log expression and its syslog backend (the timestamped wire log,
# cm_wire); without one of them the rule that needs it fails with ENOENT. nf_tables needs
# libcrc32c, whose init fails unless the "crc32c" shash exists, hence crc32c_generic first
# (nothing in the guest could autoload it).
PAIR_MODULES="crc32c_generic nf_tables nft_objref nft_numgen nft_log nf_log_syslog"

# Boot groups: one VM boot per group that has selected suites, in this order, each with its
# own guest topology (kernel command line lab.topology=GROUP, guest/init) and console log.
#   group | console log (in lab/work) | initramfs (in lab/work) | topology
# single: the suites of today's lab. Client and server share rxe0 (10.0.0.1), whose loopback
# skips the IP stack; veth1 stays without an address, so other addresses on the subnet never
# answer ARP (the UNREACHABLE tests rely on that).
# pair: two rxe devices joined by the veth pair, several address pairs, the IB CM's MADs
# between them crossing netfilter's prerouting hook, where nft counts and drops them
# (guest/lib.sh); for the suites that drop CM messages on the wire (PAIR_SUITES).
BOOT_GROUPS=(
  "single|console.log|initramfs.cpio|rxe0 on veth0 (10.0.0.1), rxe loopback"
  "pair|console-pair.log|initramfs-pair.cpio|rxe0 on veth0 (10.0.K.1) <-> rxe1 on veth1 (10.0.K.2), K < PAIRS, through nft table ip cm_fault"
)

# Suites of the pair group, rdma-core's tools only (so they run with --no-project too):
#   suite | kind | guest timeout (s) | script in lab/guest/
# fault-topology: the topology's self-test (a CM exchange on the pair, every CM message kind
# counted per direction and matched with rxe's counters, a dropped REQ and a dropped REP
# retried by the IB CM, two pairs at once, a cut); ~34 s of guest time, most of it the IB CM's
# retry intervals (6.1 s, 6.1 s, 3 s waiting on a cut pair), bounded at 120.
PAIR_SUITES=(
  "fault-topology|plain|120|fault-topology.sh"
)

# Project binaries, data driven.  One row per binary:
#   suite | kind | guest timeout (s) | cargo arguments | artifact (target kind:target name) | guest arguments [| guest environment [| boot group]]
# kind selects how the summary reads the output: hwrunner, libtest, criterion, cmtime, echo,
# differential, plain. The boot group (BOOT_GROUPS) is single unless given.
# In guest arguments and environment @ADDR, @ADDR6 and @N are replaced by the guest's IPv4 and
# IPv6 addresses and --connections. The environment (K=V words) is exported for that suite only.
# hw-test runs with --nocapture so that `skipped:` lines printed by skipping tests
# (which libtest reports as passed and would otherwise swallow) reach the console; its
# counts come from the runner's own `hw: N passed, M failed, K skipped` line (hwrunner).
PROJECT_BINS=(
  "hw-test|hwrunner|900|test --release --features hw --test hw --no-run|test:hw|--test-threads=1 --nocapture"
  # The same runner on the device's IPv6 address; bound as hw-test's. The
  # unreachable address is one of veth0's /64 that nobody answers neighbour discovery for.
  # The multicast tests are left out on IPv6: RoCEv2 carries IPv4 groups only (the kernel's
  # cma_iboe_join_multicast answers an IPv6 group with ENOTSUPP, 524, measured on rxe), and an
  # IPv6 id joined to an IPv4 group gets none of its datagrams.
  "hw-test-ipv6|hwrunner|900|test --release --features hw --test hw --no-run|test:hw|--test-threads=1 --nocapture --skip multicast::|CM_HW_ADDR=@ADDR6 CM_HW_UNREACHABLE_ADDR=fd00::fe"
  "hw-bench|criterion|300|bench --profile release --features hw --bench cm --no-run|bench:cm|--bench --warm-up-time 1 --measurement-time 2 --sample-size 10 hw"
  "hw-readiness|libtest|120|test --release -p cm-hw --test readiness --no-run|test:readiness|--test-threads=1 --nocapture"
  # cm-hw's tracing records (the `tracing` feature): a call's span and a retrieved event's id,
  # type and status on the real librdmacm; one resolve, well under a second on rxe.
  "hw-tracing|libtest|120|test --release -p cm-hw --features tracing --test tracing --no-run|test:tracing|--test-threads=1 --nocapture"
  "cmtime|cmtime|180|build --release --features hw --example cmtime|example:cmtime|--backend hw --role both --bind @ADDR --server @ADDR --connections @N"
  "sim-cmtime|cmtime|180|build --release --features hw --example cmtime|example:cmtime|--backend sim --bind 10.0.0.2 --server 10.0.0.1 --connections @N --seed 1"
  "echo|echo|180|build --release --features hw,tokio --example echo|example:echo|--backend hw --server @ADDR --clients 100 --messages 100"
  # The same echo on `Send` handles (`--handoff`): accepted on one task, each connection served
  # by a `tokio::spawn`ed worker of the multi-threaded runtime; 20 clients x 50 messages, a
  # fifth of the run above, bound 120 s.
  "echo-handoff|echo|120|build --release --features hw,tokio --example echo|example:echo|--backend hw --server @ADDR --clients 20 --messages 50 --handoff"
  # The remote counter: 4 clients x 100 RDMA fetch-and-adds on one server's 8 bytes,
  # on tokio over rxe; its last line reads as echo's. Each add is a round trip through rxe
  # (about a millisecond under TCG): a few seconds, bound 120 s.
  "counter|echo|120|build --release --features hw,tokio --example counter|example:counter|--backend hw --server @ADDR --clients 4 --adds 100"
  # Every trait call in every id state on the raw librdmacm, against the machine and the
  # simulator. Its own bound is 4 minutes (the UNREACHABLE probes wait for the IB
  # CM's retries); debug build: the time goes to the kernel, and it spares a release build.
  # It deletes rxe0 for its device-removal probes, last, and adds it back on veth0 (guest/init).
  # UNREACHABLE's requests go to 10.0.0.253, given a permanent neighbour entry to nobody's MAC
  # for the run: they leave and are never answered (the IB CM gives up after 74 s).
  "differential|differential|300|build --features differential --example differential|example:differential|--hw --addr @ADDR --remove-device rxe0:veth0 --silent-peer 10.0.0.253:veth0"
  # The project's udaddy on the simulator inside the guest (4 SIDR lookups x 20 datagrams each
  # way, in virtual time: seconds); the binary also serves the udaddy-client/-server suites.
  "udaddy|plain|60|build --release --features hw --example udaddy|example:udaddy|--backend sim -c 4 -C 20"
  # The project's mckey on the simulator inside the guest (2 members x 20 group datagrams, in
  # virtual time: well under a second); the binary also serves the mckey-sender/-receiver
  # suites. Debug build: the work is the kernel's, and it spares a release build.
  "mckey|plain|60|build --features hw --example mckey|example:mckey|--backend sim -c 2 -C 20"
  # The fault-differential suite: every pattern of examples/faultdiff/patterns.rs at
  # once, pattern K on pair K of the pair topology, its losses as nft rules in ip cm_fault,
  # against the same pattern on the simulator. The longest pattern runs 150 s (the MRA's
  # stretched retries); the bound leaves TCG room for setup and teardown of 23 connections.
  "faultdiff|differential|300|build --release --features hw --example faultdiff|example:faultdiff|--hw||pair"
)

# Suites that run the project's mckey beside rdma-core's on the one rxe (see add_mckey_suites),
# each bounded at 60 s (a join and 10 datagrams take well under a second).
MCKEY_SUITES=(mckey-sender mckey-receiver)

# Suites that run the project's udaddy against rdma-core's (see add_udaddy_suites), each
# bounded at 90 s (one SIDR lookup and 2 x 10 datagrams take well under a second on rxe).
UDADDY_SUITES=(udaddy-client udaddy-server)

# Suites that run the project's cmtime against rdma-core's (see add_interop_suites); they need
# the cmtime binary built even when its own suite is not selected.
INTEROP_SUITES=(interop-client interop-server cmtime-syscalls)

# Suites registered for this run (filled by add_suite, in run order).
SUITE_NAMES=()
declare -A SUITE_KIND=() SUITE_TMO=() SUITE_GROUP=()
# Per boot group, once booted: guest init / rxe ready (s after qemu start), why the boot failed,
# how long the VM ran, its bound, whether the bound killed it.
declare -A G_INIT=() G_READY=() G_FAIL=() G_SECS=() G_TIMEOUT=() G_TIMED_OUT=()

QEMU_PID=""                     # the `timeout` wrapping qemu
T0=""                           # $EPOCHREALTIME at qemu start

# ------------------------------------------------------------------- helpers --
log()  { printf 'lab: %s\n' "$*"; }
die()  { printf 'lab: error: %s\n' "$*" >&2; exit 2; }
elapsed() { awk -v a="$1" -v b="${2:-$EPOCHREALTIME}" 'BEGIN { printf "%.1f", b - a }'; }

usage() {
  cat <<'EOF'
usage: lab/lab.sh [run|shell] [options]

  run      (default) build everything, boot the VM, run the suites, print a summary
  shell    boot the same image and give an interactive busybox shell on the
           serial console, rxe0 already up (leave with `exit` or Ctrl-A x)

options:
  --connections N      connections for both cmtime runs (default 1000)
  --no-project         do not build/run the project's binaries; rdma-core tools only
  --no-sanity          skip the rping / ucmatose sanity suites
  --only LIST          run only these suites (comma separated names, see README)
  --extra-bin 'P [A]'  copy host binary P (with its shared libraries) into the
                       guest and run it as suite extra-<name> with arguments A
                       (repeatable; handy for probes and debugging)
  --env K=V            export K=V in the guest for all suites (repeatable),
                       e.g. --env RUST_LOG=debug --env RUST_BACKTRACE=full
  --boot-timeout S     qemu start -> rxe ready bound (default 120)
  --timeout S          bound for each VM boot (default: boot bound + its suites' bounds, max 1500)
  --build-timeout S    bound for all cargo builds together (default 900)
  --smp N, --mem MB    guest CPUs / memory (default 2 / 2048)
  --kernel-pkg NAME    Debian kernel package (default: dependency of linux-image-amd64)
  --cargo-dir DIR      build the project binaries in DIR (default: the repo root)
  --topology T         shell only: boot the single (default) or the pair topology
  -v, --verbose        also stream the guest console to stdout
  -h, --help           this text
EOF
}

parse_args() {
  if [[ $# -gt 0 && $1 != -* ]]; then
    case $1 in run|shell) MODE=$1; shift ;; *) usage >&2; die "unknown command '$1'" ;; esac
  fi
  while [[ $# -gt 0 ]]; do
    case $1 in
      --connections)   CONNECTIONS=${2:?}; shift ;;
      --no-project)    PROJECT=0 ;;
      --no-sanity)     SANITY=0 ;;
      --only)          ONLY=${2:?}; shift ;;
      --extra-bin)     EXTRA_BINS+=("${2:?}"); shift ;;
      --env)           [[ ${2:?} =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || die "--env wants K=V"
                       GUEST_ENV+=("$2"); shift ;;
      --boot-timeout)  BOOT_TIMEOUT=${2:?}; shift ;;
      --timeout)       VM_TIMEOUT=${2:?}; shift ;;
      --build-timeout) BUILD_TIMEOUT=${2:?}; shift ;;
      --smp)           VM_SMP=${2:?}; shift ;;
      --mem)           VM_MEM=${2:?}; shift ;;
      --kernel-pkg)    KERNEL_PKG=${2:?}; shift ;;
      --cargo-dir)     CARGO_DIR=$(cd "${2:?}" && pwd) || die "no directory $2"; shift ;;
      --topology)      SHELL_TOPOLOGY=${2:?}; shift ;;
      -v|--verbose)    VERBOSE=1 ;;
      -h|--help)       usage; exit 0 ;;
      *) usage >&2; die "unknown option '$1'" ;;
    esac
    shift
  done
  [[ $CONNECTIONS =~ ^[1-9][0-9]*$ ]] || die "--connections wants a positive number"
  for v in BOOT_TIMEOUT BUILD_TIMEOUT VM_SMP VM_MEM; do
    [[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "bad number for ${v}: ${!v}"
  done
  [[ -z $VM_TIMEOUT || $VM_TIMEOUT =~ ^[1-9][0-9]*$ ]] || die "bad --timeout"
  [[ $SHELL_TOPOLOGY == single || $SHELL_TOPOLOGY == pair ]] || die "--topology wants single or pair"
  [[ $SHELL_TOPOLOGY == single || $MODE == shell ]] || die "--topology is for shell (run boots each group its suites need)"
}

# Never leave qemu behind (2-core machine): kill the timeout wrapper and qemu
# itself (by pid file) on any exit path.
cleanup() {
  local pid
  if [[ -n $QEMU_PID ]] && kill -0 "$QEMU_PID" 2>/dev/null; then
    kill -TERM "$QEMU_PID" 2>/dev/null || true
  fi
  if [[ -s $WORK/qemu.pid ]]; then
    pid=$(<"$WORK/qemu.pid")
    # Only our qemu: its command line names our pid file (pids get reused).
    if kill -0 "$pid" 2>/dev/null && tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$WORK/qemu.pid"; then
      kill -TERM "$pid" 2>/dev/null || true; sleep 1; kill -KILL "$pid" 2>/dev/null || true
    fi
  fi
  return 0
}

# ---------------------------------------------------------------- host setup --
# Install what is missing (non-interactively, as root or through sudo) so a fresh CI machine
# works.
# Entries are "probe:package"; a probe is a command name or an absolute file path.
ensure_host_tools() {
  [[ $(uname -m) == x86_64 ]] || die "host must be x86_64 (its binaries are copied into the guest)"
  local need=(
    qemu-system-x86_64:qemu-system-x86 /usr/share/seabios/bios-256k.bin:seabios
    busybox:busybox-static cmtime:rdmacm-utils rping:rdmacm-utils ucmatose:rdmacm-utils
    ibv_devinfo:ibverbs-utils "/etc/libibverbs.d/rxe.driver:ibverbs-providers"
    rdma:iproute2 ip:iproute2 xz:xz-utils ldd:libc-bin dpkg-deb:dpkg apt-get:apt
  )
  # nft for the pair topology's table (its binary and libraries go into that image).
  pair_wanted && need+=(nft:nftables)
  if ((PROJECT)); then
    # rdma-sys (bindgen) needs libclang, pkg-config and the rdma-core headers.
    need+=(/usr/include/rdma/rdma_cma.h:librdmacm-dev /usr/include/infiniband/verbs.h:libibverbs-dev
           pkg-config:pkg-config "/usr/lib/llvm-*/lib/libclang*.so*:libclang-dev")
  fi
  local missing=() e probe pkg
  for e in "${need[@]}"; do
    probe=${e%%:*}; pkg=${e#*:}
    if [[ $probe == /* ]]; then
      compgen -G "$probe" >/dev/null && continue
    else
      PATH=$PATH:/usr/sbin:/sbin command -v "$probe" >/dev/null && continue
    fi
    [[ " ${missing[*]} " == *" $pkg "* ]] || missing+=("$pkg")
  done
  ((${#missing[@]} == 0)) && return 0
  log "installing ${missing[*]}"
  # -o DPkg::Lock::Timeout: another install's lock (unattended upgrades) is waited for.
  as_root timeout "$APT_TIMEOUT" apt-get -o DPkg::Lock::Timeout=600 update -qq \
    || die "apt-get update failed (missing packages: ${missing[*]}; run as root or with sudo, or apt-get install them)"
  as_root env DEBIAN_FRONTEND=noninteractive timeout "$APT_TIMEOUT" \
    apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}" || die "apt-get install ${missing[*]} failed"
}

# ------------------------------------------------------------------- kernel --
# Fetch Debian's kernel package into lab/cache (never installed on the host),
# extract the uncompressed vmlinux (boots via PVH: skips the in-guest xz
# decompression, ~4 s under TCG) and the modules we need with their load order.
# Sets KDIR (vmlinux, modules/*.ko, modules.load).
fetch_kernel() {
  log "fetching kernel"
  mkdir -p "$CACHE/kernel"
  if [[ -z $KERNEL_PKG ]]; then
    KERNEL_PKG=$(resolve_kernel_pkg) || true
    if [[ -z $KERNEL_PKG ]]; then
      # Offline and no apt lists: fall back to whatever is cached.
      local d=( "$CACHE"/kernel/*/.complete )
      ((${#d[@]})) || die "cannot resolve linux-image-amd64 and nothing cached"
      KDIR=$(dirname "${d[-1]}"); log "kernel: using cached $(basename "$KDIR") (apt unavailable)"
      return
    fi
  fi
  local ver
  ver=$(apt-cache policy "$KERNEL_PKG" 2>/dev/null | awk '/Candidate:/ { print $2 }')
  [[ -n $ver && $ver != "(none)" ]] || ver=$(cd "$CACHE/kernel" && ls -1 "${KERNEL_PKG}"_*.deb 2>/dev/null | tail -1 | cut -d_ -f2) || true
  [[ -n $ver ]] || die "no version of $KERNEL_PKG available"
  KDIR=$CACHE/kernel/${KERNEL_PKG}_${ver}
  if [[ -f $KDIR/.complete && $(<"$KDIR/.complete") == "$ROOT_MODULES | $PAIR_MODULES" ]]; then
    log "kernel: $KERNEL_PKG $ver (cached)"
    return
  fi
  local deb=( "$CACHE/kernel/${KERNEL_PKG}_${ver//:/%3a}_"*.deb )
  if ((${#deb[@]} == 0)); then
    log "kernel: downloading $KERNEL_PKG $ver"
    # apt-get download writes to the cwd; the _apt sandbox warning is harmless.
    (cd "$CACHE/kernel" && timeout "$APT_TIMEOUT" apt-get download -qq "$KERNEL_PKG=$ver" 2>&1 | grep -v 'unsandboxed' >&2 || true)
    deb=( "$CACHE/kernel/${KERNEL_PKG}_"*.deb )
    ((${#deb[@]})) || die "apt-get download $KERNEL_PKG failed"
  fi
  log "kernel: extracting ${deb[-1]##*/}"
  local tmp=$CACHE/kernel/tmp.$$
  rm -rf "$tmp" "$KDIR"; mkdir -p "$tmp" "$KDIR/modules"
  timeout 300 dpkg-deb -x "${deb[-1]}" "$tmp" || die "dpkg-deb -x failed"
  extract_vmlinux "$tmp"/boot/vmlinuz-* "$KDIR/vmlinux"
  cp "$tmp"/boot/config-* "$KDIR/config"
  local mdir=( "$tmp"/lib/modules/*/ )
  resolve_modules "${mdir[0]}" "$KDIR"
  rm -rf "$tmp"
  echo "$ROOT_MODULES | $PAIR_MODULES" > "$KDIR/.complete"
  log "kernel: cached in ${KDIR#"$LAB_DIR"/}"
}

resolve_kernel_pkg() {
  local p
  p=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-/ { print $2; exit }')
  if [[ -z $p ]]; then
    as_root timeout "$APT_TIMEOUT" apt-get -o DPkg::Lock::Timeout=600 update -qq >&2 || return 1
    p=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-/ { print $2; exit }')
  fi
  [[ -n $p ]] && echo "$p"
}

# bzImage = setup code + compressed payload; Debian's payload is one xz stream.
# Cut at the xz magic and decompress just that stream (trailing bytes ignored).
extract_vmlinux() {
  local vmlinuz=$1 out=$2 off
  off=$(LC_ALL=C grep -obUaP '\xfd7zXZ\x00' "$vmlinuz" | head -1 | cut -d: -f1) || true
  [[ -n $off ]] || die "no xz stream in $vmlinuz (kernel not xz-compressed?)"
  { tail -c +$((off + 1)) "$vmlinuz" || true; } | xz -dcq --single-stream > "$out" \
    || die "xz -d of the kernel payload failed"
  [[ $(head -c 4 "$out" | od -An -c | tr -d ' ') == 177ELF ]] || die "extracted vmlinux is not ELF"
}

# Copy the closure of ROOT_MODULES (via each module's `depends=`) and write the
# load order (dependencies first) to modules.load; then the same for PAIR_MODULES, less what
# modules.load already loads, to modules-pair.load.  Modules are uncompressed in
# Debian 12 (CONFIG_MODULE_COMPRESS_NONE); decompress here if that ever changes,
# busybox insmod cannot load compressed modules.
resolve_modules() {
  local mdir=$1 kdir=$2 m f
  declare -A path=() seen=()
  while IFS= read -r f; do
    m=${f##*/}; m=${m%%.ko*}; path[$m]=$f
  done < <(find "$mdir" -name '*.ko*')
  local order=()
  visit() {
    local m=$1 f deps d
    [[ -n ${seen[$m]:-} ]] && return
    seen[$m]=1
    f=${path[$m]:-}; [[ -n $f ]] || die "module $m not found in kernel package"
    case $f in
      *.ko.xz)  xz -dc "$f" > "$kdir/modules/$m.ko" ;;
      *.ko.zst) zstd -qdc "$f" > "$kdir/modules/$m.ko" ;;
      *.ko.gz)  gzip -dc "$f" > "$kdir/modules/$m.ko" ;;
      *)        cp "$f" "$kdir/modules/$m.ko" ;;
    esac
    deps=$(tr '\0' '\n' < "$kdir/modules/$m.ko" | sed -n 's/^depends=//p' | head -1)
    for d in ${deps//,/ }; do visit "${d//-/_}"; done
    order+=("$m")
  }
  for m in $ROOT_MODULES; do visit "$m"; done
  printf '%s\n' "${order[@]}" > "$kdir/modules.load"
  log "kernel: modules $(tr '\n' ' ' < "$kdir/modules.load")"
  order=()
  for m in $PAIR_MODULES; do visit "$m"; done
  printf '%s\n' "${order[@]}" > "$kdir/modules-pair.load"
  log "kernel: pair topology's modules $(tr '\n' ' ' < "$kdir/modules-pair.load")"
}

# ------------------------------------------------------------------- guest fs --
# Copy a host file into the initramfs at the same path (or at $2), following symlinks.
put() {
  local src=$1 dst=${2:-$1}
  mkdir -p "$ROOT$(dirname "$dst")"
  cp -L "$src" "$ROOT$dst"
}

# Copy an ELF binary plus the ldd closure of its shared libraries (at the paths
# the loader will look for them).
put_elf() {
  local src=$1 dst=${2:-$1} lib
  put "$src" "$dst"
  ldd "$src" 2>/dev/null | grep -q 'not found' && die "$src: $(ldd "$src" | grep 'not found' | head -1)"
  while IFS= read -r lib; do
    [[ -e $ROOT$lib ]] || put "$lib"
  done < <(ldd "$src" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }')
}

# Register a suite: its guest script comes on stdin (sh, run from /tmp with the
# suite environment; /lab/lib.sh is sourced first). GROUP: its boot group (default single).
add_suite() {
  local name=$1 kind=$2 tmo=$3 group=${4:-single}
  [[ $name =~ ^[A-Za-z0-9_.-]+$ ]] || die "bad suite name '$name'"
  [[ -e $ROOT/lab/suites-$group.list ]] || die "suite $name: no boot group '$group'"
  if [[ -n $ONLY && ",$ONLY," != *",$name,"* ]]; then cat >/dev/null; return; fi
  SUITE_NAMES+=("$name"); SUITE_KIND[$name]=$kind; SUITE_TMO[$name]=$tmo; SUITE_GROUP[$name]=$group
  { echo '. /lab/lib.sh'; cat; } > "$ROOT/lab/suites/$name.sh"
  echo "$name $tmo" >> "$ROOT/lab/suites-$group.list"
}

# The groups that have selected suites, in BOOT_GROUPS order.
booted_groups() {
  local row g n
  for row in "${BOOT_GROUPS[@]}"; do
    g=${row%%|*}
    for n in "${SUITE_NAMES[@]}"; do [[ ${SUITE_GROUP[$n]} == "$g" ]] && { echo "$g"; break; }; done
  done
}

# boot_group_field GROUP N: the N-th field of the group's BOOT_GROUPS row.
boot_group_field() {
  local row
  for row in "${BOOT_GROUPS[@]}"; do
    [[ ${row%%|*} == "$1" ]] && { cut -d'|' -f"$2" <<<"$row"; return; }
  done
}

console_log() { echo "$WORK/$(boot_group_field "$1" 2)"; }

# Whether the image needs the pair topology's files (nft, its modules): a pair suite is
# selected (run), or `shell --topology pair`. Known from the options alone, before any suite
# is registered, so the single group's image is what it was when no pair suite runs.
pair_wanted() {
  local row n g
  [[ $MODE == shell ]] && { [[ $SHELL_TOPOLOGY == pair ]]; return; }
  [[ -z $ONLY ]] && return 0
  for row in "${PAIR_SUITES[@]}"; do [[ ",$ONLY," == *",${row%%|*},"* ]] && return 0; done
  for row in "${PROJECT_BINS[@]}"; do
    IFS='|' read -r n _ _ _ _ _ _ g <<<"$row"
    [[ $g == pair && ",$ONLY," == *",$n,"* ]] && ((PROJECT)) && return 0
  done
  return 1
}

# The pair group's suites (PAIR_SUITES), their scripts from lab/guest/.
add_pair_suites() {
  local row suite kind tmo script
  for row in "${PAIR_SUITES[@]}"; do
    IFS='|' read -r suite kind tmo script <<<"$row"
    add_suite "$suite" "$kind" "$tmo" pair < "$LAB_DIR/guest/$script"
  done
}

subst() { local s=${1//@ADDR6/$ADDR6}; s=${s//@ADDR/$ADDR}; echo "${s//@N/$CONNECTIONS}"; }

# rdma-core's reference tools, always present.
add_rdmacore_suites() {
  put_elf "$(command -v cmtime)"; put_elf "$(command -v rping)"; put_elf "$(command -v ucmatose)"
  put_elf "$(command -v ibv_devinfo)"
  if ((SANITY)); then
    add_suite sanity-rping plain 60 <<EOF
# RC send / RDMA read / RDMA write ping-pong, 10 iterations, validated
rping -s -a $ADDR -C 10 -V > /tmp/rping-server.log 2>&1 &
srv=\$!
wait_listen 7174 || { cat /tmp/rping-server.log; exit 1; }
timeout 30 rping -c -a $ADDR -I $ADDR -C 10 -V -v
rc=\$?
wait_pid \$srv 10 || rc=1
echo "--- server"; cat /tmp/rping-server.log
exit \$rc
EOF
    add_suite sanity-ucmatose plain 60 <<EOF
# 10 parallel connections with 10 sends each
ucmatose -b $ADDR -c 10 > /tmp/ucmatose-server.log 2>&1 &
srv=\$!
wait_listen 7471 || { cat /tmp/ucmatose-server.log; exit 1; }
timeout 30 ucmatose -s $ADDR -b $ADDR -c 10
rc=\$?
wait_pid \$srv 10 || rc=1
echo "--- server"; cat /tmp/ucmatose-server.log
exit \$rc
EOF
  fi
  put_elf "$(command -v mckey)"
  add_suite rdmacore-mckey plain 60 <<EOF
# Does multicast work on the lab's single rxe? rdma-core's mckey as receiver (joins, waits for
# 10 datagrams) and as sender (joins, sends 10) on the same device and address.
mckey -m 239.1.2.3 -b $ADDR -C 10 > /tmp/mckey-receiver.log 2>&1 &
rcv=\$!
usleep 1000000
timeout 30 mckey -m 239.1.2.3 -b $ADDR -C 10 -s
rc=\$?
wait_pid \$rcv 10 || { echo "lab: the receiver got nothing (still waiting after 10 s)"; rc=1; }
echo "--- receiver"; cat /tmp/mckey-receiver.log
exit \$rc
EOF
  add_suite rdmacore-cmtime cmtime 180 <<EOF
# rdma-core v44 cmtime: server in the background, client in the foreground,
# both on the guest's own address (rxe loops it back).  The client prints the
# table; the v44 server never exits on its own, so it is stopped afterwards.
cmtime -b $ADDR -c $CONNECTIONS > /tmp/cmtime-server.log 2>&1 &
srv=\$!
wait_listen 7471 || { cat /tmp/cmtime-server.log; exit 1; }
timeout 150 cmtime -s $ADDR -b $ADDR -c $CONNECTIONS
rc=\$?
echo
usleep 200000; kill \$srv 2>/dev/null; wait_pid \$srv 2
echo "--- server (stopped by the suite)"; cat /tmp/cmtime-server.log
exit \$rc
EOF
}

# Stage "building project": build the project's binaries with cargo (table
# PROJECT_BINS) and remember each executable.  Its path comes from cargo's JSON
# (works with any CARGO_TARGET_DIR / profile).  One bound for all invocations.
declare -A PROJECT_EXE=()
build_project() {
  command -v cargo >/dev/null || die "cargo not found (needed unless --no-project)"
  # rdma-sys 0.3 pins bindgen 0.59, which panics ("... is not a valid Ident") with libclang 16
  # and later; clang-sys takes the newest installed, so prefer an older one when there is one.
  local dir
  if [[ -z ${LIBCLANG_PATH:-} ]]; then
    for dir in /usr/lib/llvm-1[0-5]/lib; do [[ -e $dir/libclang.so.1 ]] && export LIBCLANG_PATH=$dir; done
  fi
  log "building project binaries in $CARGO_DIR (bound ${BUILD_TIMEOUT}s)"
  local deadline=$((SECONDS + BUILD_TIMEOUT)) row suite kind tmo args sel gargs genv group json exe tkind tname
  for row in "${PROJECT_BINS[@]}"; do
    IFS='|' read -r suite kind tmo args sel gargs genv group <<<"$row"
    if [[ -n $ONLY && ",$ONLY," != *",$suite,"* ]] && ! { [[ $suite == cmtime ]] && interop_selected; } \
        && ! { [[ $suite == udaddy ]] && udaddy_selected; } \
        && ! { [[ $suite == mckey ]] && mckey_selected; }; then
      continue
    fi
    tkind=${sel%%:*}; tname=${sel#*:}
    json=$WORK/cargo-$suite.json
    log "  $suite: cargo $args"
    # shellcheck disable=SC2086  # args is a word list by design
    if ! (cd "$CARGO_DIR" && timeout "$((deadline > SECONDS ? deadline - SECONDS : 1))" \
            cargo $args --message-format=json > "$json" 2> "$WORK/cargo-$suite.log"); then
      tail -n 30 "$WORK/cargo-$suite.log" >&2
      die "cargo $args failed or hit the build bound (log: ${WORK#"$REPO"/}/cargo-$suite.log; --no-project runs without the project)"
    fi
    exe=$(grep -F '"reason":"compiler-artifact"' "$json" | grep -F "\"kind\":[\"$tkind\"]" \
          | grep -F "\"name\":\"$tname\"" | grep -o '"executable":"[^"]*"' | tail -1 | cut -d'"' -f4) || true
    [[ -n $exe && -x $exe ]] || die "no $tkind '$tname' executable in cargo's output (${json#"$REPO"/})"
    log "  $suite: ${exe#"$CARGO_DIR"/}"
    PROJECT_EXE[$suite]=$exe
  done
  if dropin_selected || perftest_selected || program_selected; then build_dropin "$deadline"; fi
}

# Copy the built project binaries into the image and register their suites.
add_project_suites() {
  local row suite kind tmo args sel gargs genv group
  for row in "${PROJECT_BINS[@]}"; do
    IFS='|' read -r suite kind tmo args sel gargs genv group <<<"$row"
    [[ -n ${PROJECT_EXE[$suite]:-} ]] || continue
    put_elf "${PROJECT_EXE[$suite]}" "/lab/bin/$suite"
    add_suite "$suite" "$kind" "$tmo" "${group:-single}" <<EOF
${genv:+export $(subst "$genv")}
exec /lab/bin/$suite $(subst "$gargs")
EOF
  done
}

udaddy_selected() {
  local s
  [[ -z $ONLY ]] && return 0
  for s in "${UDADDY_SUITES[@]}"; do [[ ",$ONLY," == *",$s,"* ]] && return 0; done
  return 1
}

# The project's udaddy against rdma-core's, each as the other's peer, both exchanging
# datagrams: udaddy-client runs ours as client against rdma-core's server, udaddy-server the
# reverse. Both programs exit by themselves and must print "return status 0".
add_udaddy_suites() {
  [[ -n ${PROJECT_EXE[udaddy]:-} ]] || return 0
  put_elf "$(command -v udaddy)"
  add_suite udaddy-client plain 90 <<EOF
udaddy -b $ADDR -c 1 -C 10 > /tmp/udaddy-server.log 2>&1 &
srv=\$!
wait_listen 7174 || { cat /tmp/udaddy-server.log; exit 1; }
timeout 60 /lab/bin/udaddy --backend hw -s $ADDR -b $ADDR -c 1 -C 10
rc=\$?
wait_pid \$srv 20 || { echo "lab: rdma-core's udaddy server did not finish"; rc=1; }
echo "--- rdma-core server"; cat /tmp/udaddy-server.log
grep -q "return status 0" /tmp/udaddy-server.log || rc=1
exit \$rc
EOF
  add_suite udaddy-server plain 90 <<EOF
/lab/bin/udaddy --backend hw -b $ADDR -c 1 -C 10 > /tmp/udaddy-server.log 2>&1 &
srv=\$!
wait_listen 7174 || { cat /tmp/udaddy-server.log; exit 1; }
timeout 60 udaddy -s $ADDR -b $ADDR -c 1 -C 10
rc=\$?
wait_pid \$srv 20 || { echo "lab: the project's udaddy server did not finish"; rc=1; }
echo "--- project server"; cat /tmp/udaddy-server.log
grep -q "return status 0" /tmp/udaddy-server.log || rc=1
exit \$rc
EOF
}

mckey_selected() {
  local s
  [[ -z $ONLY ]] && return 0
  for s in "${MCKEY_SUITES[@]}"; do [[ ",$ONLY," == *",$s,"* ]] && return 0; done
  return 1
}

# The project's mckey beside rdma-core's on the same device and group: mckey-sender sends with
# ours to rdma-core's receiver, mckey-receiver the reverse. The receiver must get all 10
# datagrams; ours must print "return status 0".
add_mckey_suites() {
  [[ -n ${PROJECT_EXE[mckey]:-} ]] || return 0
  put_elf "$(command -v mckey)"
  add_suite mckey-sender plain 60 <<EOF
mckey -m 239.1.2.4 -b $ADDR -C 10 > /tmp/mckey-receiver.log 2>&1 &
rcv=\$!
usleep 1000000
timeout 30 /lab/bin/mckey --backend hw -m 239.1.2.4 -b $ADDR -C 10 -s
rc=\$?
wait_pid \$rcv 10 || { echo "lab: rdma-core's receiver did not get all 10 (still waiting after 10 s)"; rc=1; }
echo "--- rdma-core receiver"; cat /tmp/mckey-receiver.log
exit \$rc
EOF
  add_suite mckey-receiver plain 60 <<EOF
/lab/bin/mckey --backend hw -m 239.1.2.5 -b $ADDR -C 10 > /tmp/mckey-receiver.log 2>&1 &
rcv=\$!
usleep 1000000
timeout 30 mckey -m 239.1.2.5 -b $ADDR -C 10 -s
rc=\$?
wait_pid \$rcv 20 || { echo "lab: the project's receiver did not get all 10 (still waiting after 20 s)"; rc=1; }
echo "--- project receiver"; cat /tmp/mckey-receiver.log
grep -q "return status 0" /tmp/mckey-receiver.log || rc=1
exit \$rc
EOF
}

interop_selected() {
  local s
  [[ -z $ONLY ]] && return 0
  for s in "${INTEROP_SUITES[@]}"; do [[ ",$ONLY," == *",$s,"* ]] && return 0; done
  return 1
}

# The project's cmtime against rdma-core's v44 cmtime, each as the other's peer: a check by a
# program nobody here wrote.  interop-client: ours as client, theirs as server (which never
# exits; stopped after the client).  interop-server: ours as server (it exits once it served
# N connections), theirs as client.  The client of each prints the table.
add_interop_suites() {
  [[ -n ${PROJECT_EXE[cmtime]:-} ]] || return 0
  add_suite interop-client cmtime 180 <<EOF
cmtime -b $ADDR -c $CONNECTIONS > /tmp/cmtime-server.log 2>&1 &
srv=\$!
wait_listen 7471 || { cat /tmp/cmtime-server.log; exit 1; }
timeout 150 /lab/bin/cmtime --backend hw --role client --bind $ADDR --server $ADDR --connections $CONNECTIONS
rc=\$?
echo
usleep 200000; kill \$srv 2>/dev/null; wait_pid \$srv 2
echo "--- rdma-core server (stopped by the suite)"; cat /tmp/cmtime-server.log
exit \$rc
EOF
  add_suite interop-server cmtime 180 <<EOF
/lab/bin/cmtime --backend hw --role server --bind $ADDR --connections $CONNECTIONS > /tmp/cmtime-server.log 2>&1 &
srv=\$!
wait_listen 7471 || { cat /tmp/cmtime-server.log; exit 1; }
timeout 150 cmtime -s $ADDR -b $ADDR -c $CONNECTIONS
rc=\$?
echo
# Ours exits by itself once every connection was torn down.
wait_pid \$srv 20 || { echo "lab: the project's cmtime server did not finish"; rc=1; }
echo "--- project server"; cat /tmp/cmtime-server.log
exit \$rc
EOF
  # System calls per connection (strace -f -c): ours on the hw backend (server thread and client
  # in one process) against rdma-core v44's cmtime (a server and a client process), 100
  # connections each. Counts, not times: TCG cannot blur them. About 20 s; bound 240 s.
  put_elf "$(command -v strace)"
  add_suite cmtime-syscalls plain 240 <<EOF
n=100
strace -f -c -o /tmp/ours.sc /lab/bin/cmtime --backend hw --role both --bind $ADDR --server $ADDR --connections \$n > /tmp/ours.out 2>&1
orc=\$?
strace -f -c -o /tmp/theirs-server.sc cmtime -b $ADDR -c \$n > /tmp/theirs-server.out 2>&1 &
st=\$!
wait_listen 7471 || { cat /tmp/theirs-server.out; exit 1; }
timeout 150 strace -f -c -o /tmp/theirs-client.sc cmtime -s $ADDR -b $ADDR -c \$n > /tmp/theirs-client.out 2>&1
trc=\$?
usleep 500000
# The v44 server never exits: stop the traced cmtime, and strace writes its table.
for p in \$(pidof cmtime); do kill \$p; done
wait_pid \$st 10
echo "--- ours (rc \$orc)"; cat /tmp/ours.out
echo "--- rdma-core client (rc \$trc)"; cat /tmp/theirs-client.out
# "% time seconds usecs/call calls [errors] syscall": the calls per syscall, summed over the
# server's and the client's tables for rdma-core, per connection.
awk -v n=\$n '
  FNR == 1 { side = (FILENAME ~ /ours/) ? "ours" : "theirs" }
  \$1 ~ /^[0-9.]+\$/ && \$NF != "total" && NF >= 5 { c[side, \$NF] += \$4; names[\$NF] = 1; t[side] += \$4 }
  END {
    printf "syscalls per connection (%d connections): syscall ours rdma-core\\n", n
    for (s in names) printf "syscalls: %-16s %8.2f %8.2f\\n", s, c["ours", s] / n, c["theirs", s] / n
    printf "syscalls: %-16s %8.2f %8.2f\\n", "TOTAL", t["ours"] / n, t["theirs"] / n
  }' /tmp/ours.sc /tmp/theirs-server.sc /tmp/theirs-client.sc | sort -k2
[ \$orc = 0 ] && [ \$trc = 0 ]
EOF
}

add_extra_suites() {
  local spec path args name
  for spec in "${EXTRA_BINS[@]}"; do
    read -r path args <<<"$spec"
    [[ -x $path ]] || die "--extra-bin: $path is not an executable"
    name=extra-$(basename "$path" | tr -c 'A-Za-z0-9_.\n-' '_')
    put_elf "$path" "/lab/bin/$name"
    add_suite "$name" plain 120 <<EOF
exec /lab/bin/$name $(subst "$args")
EOF
  done
}

# ------------------------------------------------------- drop-in comparison --
# rdma-core's programs (Debian's rdmacm-utils), the pairs cm-dropin/tests/c_programs.rs runs on
# the simulator, run twice with the same flags: on rxe in the guest, and on the simulator through
# cmsim-daemon/cmsim-run on the host before the VM boots. The summary compares what each program
# reported (exit statuses, the lines it printed with timings left out, connection and message
# counts) in one line per program; any difference fails the lab.
#
# Why the simulator side runs on the host and not in the guest: it is the very environment of the
# host tests (same binaries, same library directory cmsim-run lays out), and the daemon follows
# the wall clock: in the guest, TCG's two emulated CPUs would be shared by the daemon and two
# programs that spin (cmtime's sched_yield loops, ucmatose's busy ibv_poll_cq), so the daemon's
# IB CM timeouts would fire from starvation and a mismatch would say more about TCG than about
# the drop-in. rxe has no such problem: the kernel does its CM work.
#
# One row per pair:  suite | bound (s) | port | server ends by itself (1) or is stopped after the
# client (0, cmtime's v44 server never exits) | server command | client command
# @S and @C are the server's and the client's address: on rxe both are the guest's, on the
# simulator two hosts, 10.0.0.1 and 10.0.0.2, as in the host tests.
DROPIN_PAIRS=(
  "dropin-cmtime-100|120|7471|0|cmtime -b @S -c 100|cmtime -s @S -b @C -c 100"
  "dropin-cmtime-1000|180|7471|0|cmtime -b @S -c 1000|cmtime -s @S -b @C -c 1000"
  "dropin-ucmatose|90|7471|1|ucmatose -b @S -c 4 -C 20 -S 2000|ucmatose -s @S -b @C -c 4 -C 20 -S 2000 -t 32"
  "dropin-rdma-server|90|7471|1|rdma_server -s @S|rdma_client -s @S"
)
DROPIN_SIM_SERVER=10.0.0.1
DROPIN_SIM_CLIENT=10.0.0.2
declare -A DROPIN_EXE=()        # cmsim-daemon / cmsim-run, from cargo's JSON

dropin_selected() {
  local row
  [[ -z $ONLY ]] && return 0
  for row in "${DROPIN_PAIRS[@]}"; do [[ ",$ONLY," == *",${row%%|*},"* ]] && return 0; done
  return 1
}

# Builds cm-dropin's daemon, wrapper and library (debug, as the host tests do), within what is
# left of build_project's bound (deadline in $SECONDS).
build_dropin() {
  local deadline=$1 json=$WORK/cargo-dropin.json b exe
  log "  dropin: cargo build -p cm-dropin"
  if ! (cd "$CARGO_DIR" && timeout "$((deadline > SECONDS ? deadline - SECONDS : 1))" \
          cargo build -p cm-dropin --message-format=json > "$json" 2> "$WORK/cargo-dropin.log"); then
    tail -n 30 "$WORK/cargo-dropin.log" >&2
    die "cargo build -p cm-dropin failed or hit the build bound (log: ${WORK#"$REPO"/}/cargo-dropin.log)"
  fi
  for b in cmsim-daemon cmsim-run; do
    exe=$(grep -F '"reason":"compiler-artifact"' "$json" | grep -F '"kind":["bin"]' \
          | grep -F "\"name\":\"$b\"" | grep -o '"executable":"[^"]*"' | tail -1 | cut -d'"' -f4) || true
    [[ -n $exe && -x $exe ]] || die "no bin '$b' executable in cargo's output (${json#"$REPO"/})"
    DROPIN_EXE[$b]=$exe
  done
  log "  dropin: ${DROPIN_EXE[cmsim-daemon]#"$CARGO_DIR"/}, ${DROPIN_EXE[cmsim-run]#"$CARGO_DIR"/}"
}

# The guest side: each pair on rxe. The suite prints the record dropin_facts reads (the same
# shape dropin_run_sim writes) and fails unless the client exited 0 and the server exited 0 or
# was still serving when stopped.
add_dropin_suites() {
  local row suite tmo port ends scmd ccmd p
  for p in cmtime ucmatose rdma_server rdma_client; do put_elf "$(command -v "$p")"; done
  for row in "${DROPIN_PAIRS[@]}"; do
    IFS='|' read -r suite tmo port ends scmd ccmd <<<"$row"
    scmd=${scmd//@S/$ADDR}; ccmd=${ccmd//@S/$ADDR}; ccmd=${ccmd//@C/$ADDR}
    add_suite "$suite" dropin "$tmo" <<EOF
# CM messages rxe0's port has sent, per kind: "kind sent retries" (the IB CM's counters; sent
# counts every retransmission too).
cm_sent() {
  for m in req rep rtu dreq drep rej mra lap apr sidr_req sidr_rep; do
    t=\$(cat /sys/class/infiniband/rxe0/ports/1/cm_tx_msgs/\$m 2>/dev/null)
    r=\$(cat /sys/class/infiniband/rxe0/ports/1/cm_tx_retries/\$m 2>/dev/null)
    echo "\$m \${t:-x} \${r:-x}"
  done
}
cm_sent > /tmp/cm.before
sends0=\$(cat /sys/class/infiniband/rxe0/ports/1/hw_counters/rdma_sends)
$scmd > /tmp/server.out 2> /tmp/server.err &
srv=\$!
wait_listen $port || { cat /tmp/server.out /tmp/server.err; exit 1; }
timeout $((tmo - 25)) $ccmd > /tmp/client.out 2> /tmp/client.err
crc=\$?
if [ $ends = 1 ]; then
  i=0
  while kill -0 \$srv 2>/dev/null && [ \$i -lt 150 ]; do usleep 100000; i=\$((i + 1)); done
fi
if kill -0 \$srv 2>/dev/null; then
  [ $ends = 1 ] && src=hung || src=stopped
  kill \$srv; usleep 200000; kill -9 \$srv 2>/dev/null; wait \$srv
else
  wait \$srv; src=\$?
fi
usleep 200000
cm_sent > /tmp/cm.after
sends=\$((\$(cat /sys/class/infiniband/rxe0/ports/1/hw_counters/rdma_sends) - sends0))
# Both ends are on this port (rxe loops back), so these are the pair's messages; first
# transmissions only: a retry on a slow emulated CPU is not a different result. rxe's
# rdma_sends counts every message sent, the IB CM's (QP1) included: the rest are the programs'.
awk -v sends=\$sends 'NR == FNR { t[\$1] = \$2; r[\$1] = \$3; next }
     \$2 == "x" || \$3 == "x" || t[\$1] == "x" { bad = 1; next }
     { all += \$2 - t[\$1]; first[\$1] = (\$2 - \$3) - (t[\$1] - r[\$1]) }
     END {
       if (bad) { print "cm-sent: no IB CM counters"; exit }
       printf "cm-sent: REQ %d, REP %d, RTU %d, DREQ %d, DREP %d\\n", first["req"], first["rep"], first["rtu"], first["dreq"], first["drep"]
       printf "data-sends: %d\\n", sends - all
     }' /tmp/cm.before /tmp/cm.after
echo "server-rc: \$src"; echo "client-rc: \$crc"
for f in server.out server.err client.out client.err; do
  sed "s/^/\${f%.*}-\${f#*.}: /" /tmp/\$f
done
[ \$crc = 0 ] && { [ \$src = 0 ] || [ \$src = stopped ]; }
EOF
  done
}

# Waits at most $2 seconds for the background job $1 and sets DROPIN_RC to its exit status, or to
# "hung" after killing it. (A variable, not output: `wait` needs the job's own shell, not a
# command substitution's.)
dropin_wait() {
  local pid=$1 i=0
  DROPIN_RC=0
  while kill -0 "$pid" 2>/dev/null && ((i < $2 * 10)); do sleep 0.1; i=$((i + 1)); done
  if kill -0 "$pid" 2>/dev/null; then
    kill -KILL "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; DROPIN_RC=hung; return
  fi
  wait "$pid" || DROPIN_RC=$?
}

# The host side: one pair on a fresh fabric daemon (seed 7, two hosts), each process under
# `timeout` so that nothing outlives its bound even if the lab is killed. Writes the record to
# $OUT/<suite>.sim (the daemon's output beside it, .daemon).
dropin_run_sim() {
  local suite=$1 tmo=$2 port=$3 ends=$4 scmd=$5 ccmd=$6
  local dir=$WORK/dropin sock=$WORK/dropin/$suite.sock srv dmn src crc=0 i=0 f DROPIN_RC
  mkdir -p "$dir"; rm -f "$sock"
  scmd=${scmd//@S/$DROPIN_SIM_SERVER}
  ccmd=${ccmd//@S/$DROPIN_SIM_SERVER}; ccmd=${ccmd//@C/$DROPIN_SIM_CLIENT}
  # CMSIM_DEBUG: the daemon logs every request, so the sends the programs posted can be counted.
  CMSIM_DEBUG=1 timeout -k 5 "$((tmo + 15))" "${DROPIN_EXE[cmsim-daemon]}" --socket "$sock" \
    --host "$DROPIN_SIM_SERVER" --host "$DROPIN_SIM_CLIENT" --seed 7 --processes 2 \
    --max-seconds "$((tmo + 10))" --trace "$OUT/$suite.trace" > "$OUT/$suite.daemon" 2>&1 &
  dmn=$!
  while [[ ! -S $sock ]] && kill -0 "$dmn" 2>/dev/null && ((i < 100)); do sleep 0.1; i=$((i + 1)); done
  # shellcheck disable=SC2086  # the commands are word lists by design
  timeout -k 5 "$tmo" "${DROPIN_EXE[cmsim-run]}" --socket "$sock" --host "$DROPIN_SIM_SERVER" -- \
    $scmd > "$dir/server.out" 2> "$dir/server.err" &
  srv=$!
  # shellcheck disable=SC2086
  timeout -k 5 "$((tmo - 25))" "${DROPIN_EXE[cmsim-run]}" --socket "$sock" --host "$DROPIN_SIM_CLIENT" \
    --wait-for-listener "$DROPIN_SIM_SERVER:$port" -- $ccmd > "$dir/client.out" 2> "$dir/client.err" || crc=$?
  if ((ends)) || ! kill -0 "$srv" 2>/dev/null; then
    dropin_wait "$srv" 15; src=$DROPIN_RC
  else
    kill -TERM "$srv" 2>/dev/null || true; dropin_wait "$srv" 5; src=stopped
  fi
  dropin_wait "$dmn" 20
  {
    echo "fabric-rc: $DROPIN_RC"
    # The trace's "sent" lines, once per id and kind: first transmissions, as counted on rxe.
    awk '$4 == "sent" && !seen[$2 " " $3 " " $5]++ { n[$5]++ }
         END { printf "cm-sent: REQ %d, REP %d, RTU %d, DREQ %d, DREP %d\n", n["REQ"], n["REP"], n["RTU"], n["DREQ"], n["DREP"] }' \
      "$OUT/$suite.trace" 2>/dev/null || echo "cm-sent: no trace"
    echo "data-sends: $(grep -c ' Some(PostSend) = 0$' "$OUT/$suite.daemon" || true)"
    echo "server-rc: $src"; echo "client-rc: $crc"
    for f in server.out server.err client.out client.err; do sed "s/^/${f%.*}-${f#*.}: /" "$dir/$f"; done
  } > "$OUT/$suite.sim"
  rm -f "$sock"
}

run_dropin_sims() {
  local row suite tmo port ends scmd ccmd t0
  for row in "${DROPIN_PAIRS[@]}"; do
    IFS='|' read -r suite tmo port ends scmd ccmd <<<"$row"
    [[ -n ${SUITE_KIND[$suite]:-} ]] || continue
    log "simulator: $suite (on the host, cmsim-daemon)"
    t0=$EPOCHREALTIME
    dropin_run_sim "$suite" "$tmo" "$port" "$ends" "$scmd" "$ccmd"
    log "simulator: $suite finished after $(elapsed "$t0")s"
  done
}

# What is compared of one run, one "name: value" line each, from a record (lines "cm-sent:",
# "data-sends:", "server-rc:", "client-rc:", "{server,client}-{out,err}: TEXT"). Lines that carry
# decimal numbers are cmtime's timing rows: only their label (before the ':') is kept. The
# programs print no counters: connections are those the client's flag asks for (-c) less one
# per failure it reports; messages are the sends the fabric carried for the programs (on rxe its
# counter less the IB CM's messages, on the simulator the sends the daemon accepted), except for
# cmtime, which posts none (at 1000 connections rxe's counter does not follow its 5000 MADs one
# for one, so the difference would be noise); REQs and REPs are counted on the fabric (first
# transmissions: the IB CM sends neither again but as a counted retry). RTU, DREQ and DREP are
# shown, not compared: the IB CM answers every duplicate REP with a fresh RTU and every
# duplicate DREQ with a fresh DREP (not counted as retries), and a busy emulated CPU makes
# duplicates (seen: 2304 RTUs for 1000 connections); when both programs disconnect at once
# (rdma_server and rdma_client do) the count depends on which DREQ leaves first.
dropin_facts() {
  local rec=$1 cargs=$2
  awk -v cargs="$cargs" '
    function flag(f, dflt,   n, a, i) {
      n = split(cargs, a, " ")
      for (i = 1; i < n; i++) if (a[i] == f) return a[i + 1]
      return dflt
    }
    function clean(s) {
      if (s ~ /[0-9]\.[0-9]/ && index(s, ":")) s = substr(s, 1, index(s, ":") - 1)
      gsub(/[ \t]+/, " ", s); sub(/^ /, "", s); sub(/ $/, "", s)
      return s
    }
    {
      i = index($0, ": "); if (!i) next
      tag = substr($0, 1, i - 1); val = substr($0, i + 2)
    }
    tag == "cm-sent" { cm = val; next }
    tag == "data-sends" { msgs = val; next }
    tag == "server-rc" { src = val; next }
    tag == "client-rc" { crc = val; next }
    tag !~ /^(server|client)-(out|err)$/ { next }
    { v = clean(val); if (v == "") next; n[tag]++; text[tag] = text[tag] (n[tag] > 1 ? " / " : "") v }
    tag == "client-out" && val ~ /error/ { failures++ }
    tag == "client-err" { failures++ }
    END {
      prog = cargs; sub(/ .*/, "", prog)
      conns = flag("-c", prog == "cmtime" ? 100 : 1) - failures
      if (conns < 0) conns = 0
      if (prog == "cmtime") msgs = "none posted"
      disc = cm; sub(/.*REP [0-9]+, /, "", disc); sub(/, RTU.*/, "", cm)
      printf "exit: server %s, client %s\n", (src == "" ? "?" : src), (crc == "" ? "?" : crc)
      printf "lines: server %d+%d, client %d+%d\n", n["server-out"], n["server-err"], n["client-out"], n["client-err"]
      printf "connections: %s\nmessages: %s\ncm messages sent: %s\n", conns, (msgs == "" ? "?" : msgs), (cm == "" ? "?" : cm)
      printf "server stdout: %s\nserver stderr: %s\n", text["server-out"], text["server-err"]
      printf "client stdout: %s\nclient stderr: %s\n", text["client-out"], text["client-err"]
      printf "shown only: %s\n", (disc == "" ? "?" : disc)
    }' "$rec"
}

# The statuses and counts of one record's facts, on one line (server/client where there are two).
dropin_short() {
  [[ -n $1 ]] || { echo "no record"; return; }
  awk -F': ' '
    $1 == "exit" || $1 == "lines" { v = $2; sub(/^server /, "", v); sub(/, client /, "/", v); out = out (out == "" ? "" : ", ") $1 " " v }
    $1 == "connections" { out = out ", " $2 " conn" }
    $1 == "messages" { out = out ", msgs " $2 }
    $1 == "cm messages sent" { v = $2; gsub(/ /, "", v); gsub(/,/, " ", v); out = out ", CM " v }
    $1 == "shown only" { v = $2; gsub(/ /, "", v); gsub(/,/, " ", v); out = out " (" v ")" }
    END { print out }' <<<"$1"
}

# One line per pair with both results; a pair counts once, failed on any difference, when a side
# has no record, or when the simulator's daemon did not end cleanly. Runs inside summarize and
# adds to its passed/failed counters.
print_dropin_comparisons() {
  local row suite tmo port ends scmd ccmd rxe sim verdict why
  local -a shown=()
  for row in "${DROPIN_PAIRS[@]}"; do
    IFS='|' read -r suite tmo port ends scmd ccmd <<<"$row"
    [[ -n ${SUITE_KIND[$suite]:-} ]] && shown+=("$row")
  done
  ((${#shown[@]})) || return 0
  echo
  log "rdma-core's programs, rxe (guest) vs simulator (host, cm-dropin): exit and lines (stdout+stderr) server/client; (RTU DREQ DREP) shown, not compared; timings not compared"
  for row in "${shown[@]}"; do
    IFS='|' read -r suite tmo port ends scmd ccmd <<<"$row"
    rxe=""; sim=""; why=""
    [[ -f $OUT/$suite.log ]] && rxe=$(dropin_facts "$OUT/$suite.log" "$ccmd")
    [[ -f $OUT/$suite.sim ]] && sim=$(dropin_facts "$OUT/$suite.sim" "$ccmd")
    if [[ -f $OUT/$suite.sim ]] && ! grep -qx 'fabric-rc: 0' "$OUT/$suite.sim"; then
      why=" (cmsim-daemon: $(sed -n 's/^fabric-rc: //p' "$OUT/$suite.sim"))"
    fi
    if [[ -n $rxe && $(grep -v '^shown only:' <<<"$rxe") == "$(grep -v '^shown only:' <<<"$sim")" && -z $why ]]; then
      verdict=same; passed=$((passed + 1))
    else
      verdict=DIFFERENT; failed=$((failed + 1))
    fi
    log "$(printf '%-13s %-9s rxe: %s | sim: %s%s' "${suite#dropin-}" "$verdict" "$(dropin_short "$rxe")" "$(dropin_short "$sim")" "$why")"
    if [[ $verdict != same ]]; then
      diff <(grep -v '^shown only:' <<<"$rxe") <(grep -v '^shown only:' <<<"$sim") | sed -n 's/^< /      rxe | /p; s/^> /      sim | /p' || true
      log "  records: ${OUT#"$REPO"/}/$suite.log (rxe), $suite.sim and $suite.daemon (simulator)"
    fi
  done
}

# ---------------------------------------------------------------- perftest --
# Debian's perftest, the runs cm-dropin/tests/perftest.rs makes on the simulator, run twice with
# the same flags: on rxe in the guest (server and client on the guest's address), and on the
# simulator through cmsim-daemon/cmsim-run on the host before the VM boots (two hosts, as
# dropin_run_sim does, for the same reasons). The summary compares exit statuses and the result
# row's message size and iteration count, and records both figures (BW average MB/s, or t_avg
# us) and their ratio: a ratio is recorded, never a gate, since TCG's speed is not rxe's.
# Each row: suite | bound (s) | exchange (tcp: perftest's own TCP socket; cm: rdma_cm, -R) |
# port | program and options (server and client alike; the client adds the server's address).
# Bounds: 1000 iterations take well under 10 s on rxe under TCG; 60 s each, nine runs.
PERFTEST_RUNS=(
  "perftest-send-bw|60|tcp|18515|ib_send_bw -n 1000"
  "perftest-send-bw-cm|60|cm|18516|ib_send_bw -n 1000 -R"
  "perftest-write-bw|60|tcp|18517|ib_write_bw -n 1000"
  "perftest-read-bw|60|tcp|18518|ib_read_bw -n 1000"
  "perftest-atomic-bw|60|tcp|18519|ib_atomic_bw -n 1000 -A FETCH_AND_ADD"
  "perftest-send-lat|60|tcp|18520|ib_send_lat -n 1000"
  "perftest-write-lat|60|tcp|18521|ib_write_lat -n 1000"
  "perftest-write-lat-cm|60|cm|18522|ib_write_lat -n 1000 -R"
  "perftest-read-lat|60|tcp|18523|ib_read_lat -n 1000"
)

perftest_selected() {
  local row
  command -v ib_send_bw >/dev/null || return 1
  [[ -z $ONLY ]] && return 0
  for row in "${PERFTEST_RUNS[@]}"; do [[ ",$ONLY," == *",${row%%|*},"* ]] && return 0; done
  return 1
}

# The guest side. perftest 4.5's -R server listens anew for its data connection after the
# exchange, and a client quicker than that is rejected (REJECTED, error 8) and fails: a race of
# perftest's own, so a pair that lost it runs again, at most three times on each side. The
# record is dropin's shape: "server-rc:", "client-rc:", "{server,client}-{out,err}: TEXT".
add_perftest_suites() {
  local row suite tmo xchg port cmd p
  if ! command -v ib_send_bw >/dev/null; then
    log "perftest suites skipped: perftest is not installed on the host (apt-get install perftest)"
    return 0
  fi
  for p in ib_send_bw ib_write_bw ib_read_bw ib_atomic_bw ib_send_lat ib_write_lat ib_read_lat; do
    put_elf "$(command -v "$p")"
  done
  for row in "${PERFTEST_RUNS[@]}"; do
    IFS='|' read -r suite tmo xchg port cmd <<<"$row"
    add_suite "$suite" perftest "$tmo" <<EOF
# $cmd on rxe, over $xchg, port $port
tcp_listening() {
  awk -v p=":\$(printf %04X $port)" 'NR > 1 && \$4 == "0A" && substr(\$2, length(\$2) - 4) == p { f = 1 } END { exit !f }' /proc/net/tcp
}
for attempt in 1 2 3; do
  $cmd -p $port > /tmp/server.out 2> /tmp/server.err &
  srv=\$!
  i=0
  if [ $xchg = cm ]; then
    wait_listen $port >/dev/null || { cat /tmp/server.out /tmp/server.err; exit 1; }
  else
    while ! tcp_listening && [ \$i -lt 100 ]; do usleep 100000; i=\$((i + 1)); done
  fi
  timeout $((tmo / 3 - 5)) $cmd -p $port $ADDR > /tmp/client.out 2> /tmp/client.err
  crc=\$?
  src=
  wait_pid \$srv 10 || src=hung
  [ -z "\$src" ] && { wait \$srv; src=\$?; }
  grep -q 'REJECTED; error: 8' /tmp/client.err || break
  echo "lab: attempt \$attempt lost perftest's -R race, again"
done
echo "server-rc: \$src"; echo "client-rc: \$crc"
for f in server.out server.err client.out client.err; do
  sed "s/^/\${f%.*}-\${f#*.}: /" /tmp/\$f
done
[ \$crc = 0 ] && [ \$src = 0 ]
EOF
  done
}

# The host side: one run on fresh fabric daemons (seed 7, two hosts), again after a lost -R
# race as on rxe; the record to $OUT/<suite>.sim.
perftest_run_sim() {
  local suite=$1 tmo=$2 xchg=$3 port=$4 cmd=$5
  local dir=$WORK/perftest sock=$WORK/perftest/$suite.sock srv dmn src crc i attempt hex wait_for DROPIN_RC
  mkdir -p "$dir"
  hex=$(printf ':%04X' "$port")
  for attempt in 1 2 3; do
    rm -f "$sock"; crc=0; i=0
    timeout -k 5 "$((tmo + 15))" "${DROPIN_EXE[cmsim-daemon]}" --socket "$sock" \
      --host "$DROPIN_SIM_SERVER" --host "$DROPIN_SIM_CLIENT" --seed 7 --processes 2 \
      --max-seconds "$((tmo + 10))" > "$OUT/$suite.daemon" 2>&1 &
    dmn=$!
    while [[ ! -S $sock ]] && kill -0 "$dmn" 2>/dev/null && ((i < 100)); do sleep 0.1; i=$((i + 1)); done
    # shellcheck disable=SC2086  # the command is a word list by design
    timeout -k 5 "$tmo" "${DROPIN_EXE[cmsim-run]}" --socket "$sock" --host "$DROPIN_SIM_SERVER" -- \
      $cmd -p "$port" > "$dir/server.out" 2> "$dir/server.err" &
    srv=$!
    wait_for=()
    if [[ $xchg == cm ]]; then
      wait_for=(--wait-for-listener "$DROPIN_SIM_SERVER:$port")
    else
      i=0
      while ! awk -v p="$hex" 'NR > 1 && $4 == "0A" && $2 ~ p"$" { f = 1 } END { exit !f }' /proc/net/tcp \
          && kill -0 "$srv" 2>/dev/null && ((i < 200)); do sleep 0.1; i=$((i + 1)); done
    fi
    # shellcheck disable=SC2086
    timeout -k 5 "$((tmo / 3))" "${DROPIN_EXE[cmsim-run]}" --socket "$sock" --host "$DROPIN_SIM_CLIENT" \
      "${wait_for[@]}" -- $cmd -p "$port" "$DROPIN_SIM_SERVER" > "$dir/client.out" 2> "$dir/client.err" || crc=$?
    dropin_wait "$srv" 15; src=$DROPIN_RC
    dropin_wait "$dmn" 20
    grep -q 'REJECTED; error: 8' "$dir/client.err" || break
  done
  {
    echo "fabric-rc: $DROPIN_RC"
    echo "server-rc: $src"; echo "client-rc: $crc"
    for f in server.out server.err client.out client.err; do sed "s/^/${f%.*}-${f#*.}: /" "$dir/$f"; done
  } > "$OUT/$suite.sim"
  rm -f "$sock"
}

run_perftest_sims() {
  local row suite tmo xchg port cmd t0
  for row in "${PERFTEST_RUNS[@]}"; do
    IFS='|' read -r suite tmo xchg port cmd <<<"$row"
    [[ -n ${SUITE_KIND[$suite]:-} ]] || continue
    log "simulator: $suite (on the host, cmsim-daemon)"
    t0=$EPOCHREALTIME
    perftest_run_sim "$suite" "$tmo" "$xchg" "$port" "$cmd"
    log "simulator: $suite finished after $(elapsed "$t0")s"
  done
}

# One record's facts: "rc SERVER CLIENT", then the client's result row as "BYTES ITERS FIGURE"
# (the row under perftest's "#bytes" header; the figure is BW average for bandwidth tests and
# t_avg for latency tests), or "no result row".
perftest_facts() {
  awk '
    /^server-rc: / { src = $2 } /^client-rc: / { crc = $2 }
    /^client-out: / && on == 1 && NF > 3 { row = $0; on = 2 }
    /^client-out: .*#bytes/ { on = 1; lat = ($0 ~ /t_avg/) }
    END {
      printf "rc %s %s\n", src, crc
      if (row == "") { print "no result row"; exit }
      n = split(row, f, " ")
      # f[1] is the "client-out:" tag
      printf "%s %s %s\n", f[2], f[3], (lat ? f[7] : f[5])
    }' "$1"
}

# One line per run: same (both exited 0 with the same size and iterations) or DIFFERENT, both
# figures and the simulator's over rxe's. Adds to summarize's counters.
print_perftest_comparisons() {
  local row suite tmo xchg port cmd rxe sim verdict unit ratio
  local -a shown=()
  for row in "${PERFTEST_RUNS[@]}"; do
    IFS='|' read -r suite tmo xchg port cmd <<<"$row"
    [[ -n ${SUITE_KIND[$suite]:-} ]] && shown+=("$row")
  done
  ((${#shown[@]})) || return 0
  echo
  log "perftest, rxe (guest) vs simulator (host, cm-dropin): exit codes, message size x iterations compared; figures recorded (sim/rxe), not compared"
  for row in "${shown[@]}"; do
    IFS='|' read -r suite tmo xchg port cmd <<<"$row"
    rxe="no record"; sim="no record"
    [[ -f $OUT/$suite.log ]] && rxe=$(perftest_facts "$OUT/$suite.log")
    [[ -f $OUT/$suite.sim ]] && sim=$(perftest_facts "$OUT/$suite.sim")
    local rr sr
    rr=$(head -1 <<<"$rxe"); sr=$(head -1 <<<"$sim")
    local rsize rfig ssize sfig
    rsize=$(sed -n 2p <<<"$rxe" | awk '{ print $1 " B x " $2 }'); rfig=$(sed -n 2p <<<"$rxe" | awk '{ print $3 }')
    ssize=$(sed -n 2p <<<"$sim" | awk '{ print $1 " B x " $2 }'); sfig=$(sed -n 2p <<<"$sim" | awk '{ print $3 }')
    if [[ $rr == "rc 0 0" && $sr == "rc 0 0" && -n $rfig && -n $sfig && $rsize == "$ssize" ]] \
        && grep -qx 'fabric-rc: 0' "$OUT/$suite.sim"; then
      verdict=same; passed=$((passed + 1))
    else
      verdict=DIFFERENT; failed=$((failed + 1))
    fi
    unit="MB/s"; [[ $cmd == *_lat* ]] && unit="us"
    ratio=$(awk -v s="$sfig" -v r="$rfig" 'BEGIN { if (r + 0 > 0 && s != "") printf "%.2f", s / r; else print "?" }')
    log "$(printf '%-16s %-9s %s | rxe: %s, %s %s | sim: %s, %s %s | sim/rxe %s' "${suite#perftest-}" "$verdict" \
      "$cmd" "$rr" "${rfig:-?}" "$unit" "$sr" "${sfig:-?}" "$unit" "$ratio")"
    if [[ $verdict != same ]]; then
      log "  rxe: $(tr '\n' ';' <<<"$rxe") sim: $(tr '\n' ';' <<<"$sim")"
      log "  records: ${OUT#"$REPO"/}/$suite.log (rxe), $suite.sim and $suite.daemon (simulator)"
    fi
  done
}

# ---------------------------------------------------------------- programs --
# The other unmodified programs the drop-in runs on the simulator (their host tests:
# cm-dropin/tests/side_channel.rs for qperf, verbs_qp.rs for the ibv_*_pingpongs and rping -q,
# libfabric.rs for fi_info and fi_pingpong, fio.rs for fio's rdma engine), run on rxe in the
# guest and on the simulator on the host before the VM boots, as perftest's are. The summary
# compares what both sides should agree on (exit codes and the programs' own counts: what
# prog_facts says for each program) and records the figures with the simulator's over rxe's.
# Each row: suite | bound (s) | how the client waits for the server (tcp:PORT: a TCP listener,
# cm:PORT: an rdma_cm listener, -: no server) | server ends by itself (1) or is stopped after
# the client (0: qperf's server is a daemon) | the programs the simulator's daemon waits for |
# server command (- for none) | client command. @S is the server's address (rxe: the guest's,
# simulator: 10.0.0.1, the client on 10.0.0.2), @G the GID index of the server's IPv4 address
# (rxe: found in the GID table, simulator: 1, as the host tests).
# Bounds: each run takes a few seconds on rxe under TCG (qperf's rc_lat one second by -t 1).
# fio's send verb is not a row: on rxe as on the simulator the client's first SEND that finds no
# receive posted completes with status 13 (RNR retry counter exceeded; fio's rdma engine
# connects with rnr_retry_count 0 and its server posts one receive at a time), after which both
# sides wait in get_events until they are killed (seen with server iodepth 1 and 16).
# qperf's rc_lat runs for a time (-t 1), not a count: with -n it never ends, on rxe as on the
# simulator (rc_bw with -n does), so only its section is compared.
# fi_pingpong -e rdm runs in a universe of 32 (FI_UNIVERSE_SIZE): ofi_rxm's MSG CQ has
# (tx + rx size) x the universe's entries, past max_cqe (32767) with the default 256, and its
# fi_enable fails with EINVAL (ibv_create_cq), on rxe as on the simulator.
PROGRAM_RUNS=(
  "prog-qperf-rc-bw|60|tcp:19765|0|2|qperf|qperf --wait_server 10 -cm1 -vvs -n 1000 @S rc_bw"
  "prog-qperf-rc-lat|60|tcp:19765|0|2|qperf|qperf --wait_server 10 -cm1 -vvs -t 1 @S rc_lat"
  "prog-rc-pingpong|60|tcp:18530|1|2|ibv_rc_pingpong -g @G -n 200 -p 18530|ibv_rc_pingpong -g @G -n 200 -p 18530 @S"
  "prog-ud-pingpong|60|tcp:18531|1|2|ibv_ud_pingpong -g @G -n 200 -p 18531|ibv_ud_pingpong -g @G -n 200 -p 18531 @S"
  "prog-srq-pingpong|60|tcp:18532|1|2|ibv_srq_pingpong -g @G -n 200 -p 18532|ibv_srq_pingpong -g @G -n 200 -p 18532 @S"
  "prog-rping-q|60|cm:7472|1|2|rping -s -q -a @S -p 7472 -C 20 -S 1000 -v|rping -c -V -q -a @S -p 7472 -C 20 -S 1000 -v"
  "prog-fi-info|30|-|1|1|-|fi_info -p verbs"
  "prog-fi-pingpong-dgram|60|tcp:47592|1|2|fi_pingpong -p verbs -I 20|fi_pingpong -p verbs -I 20 @S"
  "prog-fi-pingpong-msg|60|tcp:47592|1|2|fi_pingpong -p verbs -e msg -I 20|fi_pingpong -p verbs -e msg -I 20 @S"
  "prog-fi-pingpong-rdm|60|tcp:47592|1|2|env FI_UNIVERSE_SIZE=32 fi_pingpong -p verbs -e rdm -I 20|env FI_UNIVERSE_SIZE=32 fi_pingpong -p verbs -e rdm -I 20 @S"
  "prog-fio-write|60|cm:24100|1|2|fio --name=server --ioengine=rdma --port=24100 --bs=4k --size=1m --rw=read --iodepth=1|fio --name=client --ioengine=rdma --port=24100 --bs=4k --size=1m --hostname=@S --verb=write --rw=write --iodepth=16"
  "prog-fio-read|60|cm:24101|1|2|fio --name=server --ioengine=rdma --port=24101 --bs=64k --size=4m --rw=read --iodepth=1|fio --name=client --ioengine=rdma --port=24101 --bs=64k --size=4m --hostname=@S --verb=read --rw=write --iodepth=8"
)

# Whether a run is selected: all of them without --only, each needs its programs on the host.
program_selected() {
  local row name
  for row in "${PROGRAM_RUNS[@]}"; do
    name=${row%%|*}
    if [[ -z $ONLY || ",$ONLY," == *",$name,"* ]]; then return 0; fi
  done
  return 1
}

# The program a command runs: its first word, past `env` and its K=V words.
program_of() {
  local w
  for w in $1; do [[ $w == env || $w == *=* ]] || { echo "$w"; return; }; done
}

# The host programs of a row.
program_bins() {
  local s c
  IFS='|' read -r _ _ _ _ _ s c <<<"$1"
  [[ $s == - ]] || program_of "$s"
  program_of "$c"
}

# The guest side: the programs and their ldd closures go into the image (only those of selected
# runs: fio's closure is 80 MB); libfabric 1.17's providers are built into libfabric.so.1 and
# fio's rdma engine into fio, so nothing they dlopen is missing but the rxe provider, which is
# always there. The record is perftest's shape.
add_program_suites() {
  local row suite tmo wait ends procs scmd ccmd b missing kind port has_srv
  for row in "${PROGRAM_RUNS[@]}"; do
    IFS='|' read -r suite tmo wait ends procs scmd ccmd <<<"$row"
    [[ -z $ONLY || ",$ONLY," == *",$suite,"* ]] || continue
    missing=""
    for b in $(program_bins "$row"); do command -v "$b" >/dev/null || missing+=" $b"; done
    if [[ -n $missing ]]; then
      log "suite $suite skipped: not installed on the host:$missing (qperf, ibverbs-utils, rdmacm-utils, libfabric-bin, fio)"
      continue
    fi
    for b in $(program_bins "$row"); do [[ -e $ROOT$(command -v "$b") ]] || put_elf "$(command -v "$b")"; done
    kind=${wait%%:*}; port=${wait#*:}
    # The guest finds @G itself: \$gid in its script.
    scmd=${scmd//@S/$ADDR}; scmd=${scmd//@G/\$gid}; ccmd=${ccmd//@S/$ADDR}; ccmd=${ccmd//@G/\$gid}
    has_srv=1; [[ $scmd == - ]] && has_srv=0
    add_suite "$suite" program "$tmo" <<EOF
# $suite on rxe
. /lab/config
# The GID index of the guest's IPv4 address (RoCE v2; 1 on Linux 6.1's rxe, checked here).
gid=
for f in /sys/class/infiniband/rxe0/ports/1/gids/*; do
  n=\${f##*/}
  if grep -q "ffff:\$ADDR_GID\$" \$f && grep -q 'RoCE v2' /sys/class/infiniband/rxe0/ports/1/gid_attrs/types/\$n 2>/dev/null; then gid=\$n; break; fi
done
echo "lab: GID index of \$ADDR: \${gid:-none}"
tcp_listening() {
  awk -v p=":\$(printf %04X $port)" 'NR > 1 && \$4 == "0A" && substr(\$2, length(\$2) - 4) == p { f = 1 } END { exit !f }' /proc/net/tcp /proc/net/tcp6
}
: > /tmp/server.out; : > /tmp/server.err
src=none
if [ $has_srv = 1 ]; then
  $scmd > /tmp/server.out 2> /tmp/server.err &
  srv=\$!
  i=0
  if [ $kind = cm ]; then
    wait_listen $port >/dev/null || { cat /tmp/server.out /tmp/server.err; exit 1; }
  else
    while ! tcp_listening && [ \$i -lt 100 ]; do usleep 100000; i=\$((i + 1)); done
  fi
fi
timeout -k 5 $((tmo - 25)) $ccmd > /tmp/client.out 2> /tmp/client.err
crc=\$?
if [ $has_srv = 1 ]; then
  if [ $ends = 1 ]; then
    src=
    wait_pid \$srv 10 || src=hung
    [ -z "\$src" ] && { wait \$srv; src=\$?; }
  else
    kill \$srv; wait_pid \$srv 5 >/dev/null; src=stopped
  fi
fi
echo "server-rc: \$src"; echo "client-rc: \$crc"
for f in server.out server.err client.out client.err; do
  sed "s/^/\${f%.*}-\${f#*.}: /" /tmp/\$f
done
[ \$crc = 0 ] && { [ \$src = 0 ] || [ \$src = stopped ] || [ \$src = none ]; }
EOF
  done
}

# The host side: one run on a fresh fabric daemon (seed 7, two hosts, CMSIM_DEBUG=1 for its
# log), the server on 10.0.0.1, the client on 10.0.0.2. The programs' TCP sockets on a simulated
# host are the drop-in's side channel, on a loopback address of the host's own: the listener is
# waited for in /proc/net/tcp, whatever its address. The record to $OUT/<suite>.sim.
program_run_sim() {
  local suite=$1 tmo=$2 wait=$3 ends=$4 procs=$5 scmd=$6 ccmd=$7
  local dir=$WORK/programs sock=$WORK/programs/$suite.sock srv="" dmn src=none crc=0 i=0 hex kind port f DROPIN_RC
  local -a wait_for=()
  mkdir -p "$dir"; rm -f "$sock"
  kind=${wait%%:*}; port=${wait#*:}
  scmd=${scmd//@S/$DROPIN_SIM_SERVER}; scmd=${scmd//@G/1}
  ccmd=${ccmd//@S/$DROPIN_SIM_SERVER}; ccmd=${ccmd//@G/1}
  CMSIM_DEBUG=1 timeout -k 5 "$((tmo + 15))" "${DROPIN_EXE[cmsim-daemon]}" --socket "$sock" \
    --host "$DROPIN_SIM_SERVER" --host "$DROPIN_SIM_CLIENT" --seed 7 --processes "$procs" \
    --max-seconds "$((tmo + 10))" > "$OUT/$suite.daemon" 2>&1 &
  dmn=$!
  while [[ ! -S $sock ]] && kill -0 "$dmn" 2>/dev/null && ((i < 100)); do sleep 0.1; i=$((i + 1)); done
  : > "$dir/server.out"; : > "$dir/server.err"
  if [[ $scmd != - ]]; then
    # shellcheck disable=SC2086  # the command is a word list by design
    timeout -k 5 "$tmo" "${DROPIN_EXE[cmsim-run]}" --socket "$sock" --host "$DROPIN_SIM_SERVER" -- \
      $scmd > "$dir/server.out" 2> "$dir/server.err" &
    srv=$!
    if [[ $kind == cm ]]; then
      wait_for=(--wait-for-listener "$DROPIN_SIM_SERVER:$port")
    else
      hex=$(printf ':%04X' "$port"); i=0
      while ! awk -v p="$hex" 'NR > 1 && $4 == "0A" && $2 ~ p"$" { f = 1 } END { exit !f }' /proc/net/tcp /proc/net/tcp6 \
          && kill -0 "$srv" 2>/dev/null && ((i < 200)); do sleep 0.1; i=$((i + 1)); done
    fi
  fi
  # shellcheck disable=SC2086
  timeout -k 5 "$((tmo - 20))" "${DROPIN_EXE[cmsim-run]}" --socket "$sock" --host "$DROPIN_SIM_CLIENT" \
    "${wait_for[@]}" -- $ccmd > "$dir/client.out" 2> "$dir/client.err" || crc=$?
  if [[ -n $srv ]]; then
    if ((ends)); then
      dropin_wait "$srv" 15; src=$DROPIN_RC
    else
      kill -TERM "$srv" 2>/dev/null || true; dropin_wait "$srv" 5; src=stopped
    fi
  fi
  dropin_wait "$dmn" 20
  {
    echo "fabric-rc: $DROPIN_RC"
    echo "server-rc: $src"; echo "client-rc: $crc"
    for f in server.out server.err client.out client.err; do sed "s/^/${f%.*}-${f#*.}: /" "$dir/$f"; done
  } > "$OUT/$suite.sim"
  rm -f "$sock"
}

run_program_sims() {
  local row suite tmo wait ends procs scmd ccmd t0
  for row in "${PROGRAM_RUNS[@]}"; do
    IFS='|' read -r suite tmo wait ends procs scmd ccmd <<<"$row"
    [[ -n ${SUITE_KIND[$suite]:-} ]] || continue
    log "simulator: $suite (on the host, cmsim-daemon)"
    t0=$EPOCHREALTIME
    program_run_sim "$suite" "$tmo" "$wait" "$ends" "$procs" "$scmd" "$ccmd"
    log "simulator: $suite finished after $(elapsed "$t0")s"
  done
}

# What is compared of one record, and its figures: line 1 "rc SERVER CLIENT", line 2 the
# counts (compared), line 3 the figures (recorded: "VALUE UNIT", the first the one whose ratio is
# shown). Per program, what both sides must agree on:
#   qperf: the test sections in order; for rc_bw (-n) the messages and bytes sent and received
#     (the receiver's counts come back to the client); rc_lat runs for a time, so its counts
#     are not compared. Figures: bw in MB/sec, or latency in us.
#   ibv_*_pingpong: both sides' "N bytes" and "N iters" lines (sizes x iterations, and for
#     ibv_srq_pingpong the QPs each side lists). Figures: the client's usec/iter and Mbit/sec.
#   rping: the client's validated pings ("ping data:" lines) and no "mismatch". No figures
#     (rping prints none).
#   fi_info: the endpoint types listed (distinct "provider type protocol"; the fabric and
#     domain names are the device's: rxe0's, cmsim0's). No figures.
#   fi_pingpong: both sides' table rows (size, #sent, #ack). Figures: the client's usec/xfer of
#     the smallest size and MB/sec of the largest.
#   fio: the client's err, issued I/Os and io=, the server's err. Figures: the client's bw.
prog_facts() {
  local rec=$1 prog=$2
  awk -v prog="$prog" '
    function tail(s) { sub(/^[a-z]+-[a-z]+: /, "", s); return s }
    /^server-rc: / { src = $2; next } /^client-rc: / { crc = $2; next }
    { line = tail($0) }
    prog == "qperf" && /^client-out: / {
      if (line ~ /^[a-z_]+:$/) { sec = sec (sec == "" ? "" : ",") substr(line, 1, length(line) - 1); next }
      n = split(line, w, " ")
      if (w[2] != "=") next
      v = w[3]; gsub(/,/, "", v); uu = (n > 3 ? w[4] : ""); u = (n > 3 ? " " uu : "")
      if (sec ~ /_bw$/ && w[1] ~ /^(send|recv)_(msgs|bytes)$/) cnt = cnt " " w[1] "=" v u
      # qperf picks the unit by the size of the figure: MB/sec and us here, for the ratio.
      if (w[1] == "bw") { f = v * (uu == "GB/sec" ? 1000 : uu == "KB/sec" ? 0.001 : uu == "bytes/sec" ? 1e-6 : 1); fig = fig (fig == "" ? "" : ", ") f " MB/sec" }
      if (w[1] == "latency") { f = v * (uu == "ms" ? 1000 : uu == "ns" ? 0.001 : uu == "sec" ? 1e6 : 1); fig = fig (fig == "" ? "" : ", ") f " us" }
    }
    prog ~ /^ibv_/ && /^(server|client)-out: / {
      who = substr($0, 1, 6)
      if (line ~ / bytes in .* seconds/) { cnt = cnt " " who " " $2 " bytes"; if (who == "client") { split(line, w, " "); mb = w[7] " " w[8] } }
      if (line ~ / iters in .* seconds/) { cnt = cnt " " who " " $2 " iters"; if (who == "client") { split(line, w, " "); us = w[7] " " w[8] } }
      if (line ~ /local address:/) lq[who]++
      if (line ~ /Couldn.t|Failed status|invalid data|unknown/) bad[who]++
    }
    prog == "rping" && /^client-out: ping data: rdma-ping-/ { pings++ }
    prog == "rping" && /mismatch/ { mism++ }
    prog == "fi_info" && /^client-out: / {
      k = line; sub(/^ +/, "", k)
      if (k ~ /^provider: /) { p = substr(k, 11); t = ""; pr = "" }
      if (k ~ /^type: /) t = substr(k, 7)
      if (k ~ /^protocol: /) { pr = substr(k, 11); key = p " " t " " pr; if (!(key in ep)) { ep[key] = 1; eps = eps (eps == "" ? "" : "; ") key } }
    }
    prog == "fi_pingpong" && /^(server|client)-out: / {
      who = substr($0, 1, 6)
      if (line ~ /^bytes +#sent/) { on[who] = 1; next }
      if (on[who] && split(line, w, " ") == 8) {
        b = w[1]; sub(/k$/, "000", b); sub(/m$/, "000000", b)
        if (b + 0 > 131072) { beyond[who] = beyond[who] " " w[1] "x" w[2] w[3]; next }
        rows[who] = rows[who] " " w[1] "x" w[2] w[3]
        if (who == "client") { if (first == "") first = w[7] " usec/xfer"; last = w[6] " MB/sec" }
      }
    }
    prog == "fio" && /^(server|client)-out: / {
      who = substr($0, 1, 6)
      if (line ~ /: \(groupid=0, jobs=1\): err=/) { e = line; sub(/.*err= */, "", e); sub(/:.*/, "", e); err[who] = e }
      if (line ~ /issued rwts: total=/) { s = line; sub(/.*total=/, "", s); sub(/ .*/, "", s); iss[who] = s }
      if (line ~ / io=/ && line ~ /bw=/) {
        s = line; sub(/.* io=/, "", s); sub(/ .*/, "", s); io[who] = s
        if (who == "client") { b = line; sub(/.*bw=/, "", b); sub(/ .*/, "", b); fbw = b }
      }
    }
    END {
      printf "rc %s %s\n", src, crc
      if (prog == "qperf") { printf "%s%s\n%s\n", (sec == "" ? "no sections" : sec), cnt, fig }
      else if (prog ~ /^ibv_/) {
        printf "%s", (cnt == "" ? "no summary" : substr(cnt, 2))
        if (prog == "ibv_srq_pingpong") printf ", qps server %d client %d", lq["server"], lq["client"]
        if (bad["server"] + bad["client"]) printf ", errors said"
        printf "\n%s, %s\n", us, mb
      }
      else if (prog == "rping") printf "%d pings%s\n\n", pings, (mism ? ", mismatch" : "")
      else if (prog == "fi_info") printf "%s\n\n", (eps == "" ? "no entries" : eps)
      else if (prog == "fi_pingpong") {
        printf "server%s; client%s\n%s, %s\n", rows["server"], rows["client"], first, last
        if (beyond["server"] beyond["client"] != "") printf "past the simulator'"'"'s 128 KiB max_msg_sz: server%s; client%s\n", beyond["server"], beyond["client"]
      }
      else if (prog == "fio") printf "client err=%s issued=%s io=%s; server err=%s\n%s\n", err["client"], iss["client"], io["client"], err["server"], fbw
    }' "$rec"
}

# One line per run: same (both sides exited as they should and the counts match) or DIFFERENT,
# then both sides' figures and the ratio of the first. Adds to summarize's counters.
print_program_comparisons() {
  local row suite tmo wait ends procs scmd ccmd prog rxe sim verdict ratio rr sr rc_ok
  local -a shown=()
  for row in "${PROGRAM_RUNS[@]}"; do
    IFS='|' read -r suite tmo wait ends procs scmd ccmd <<<"$row"
    [[ -n ${SUITE_KIND[$suite]:-} ]] && shown+=("$row")
  done
  ((${#shown[@]})) || return 0
  echo
  log "other programs, rxe (guest) vs simulator (host, cm-dropin): exit codes and the programs' counts compared; figures recorded (sim/rxe), not compared"
  for row in "${shown[@]}"; do
    IFS='|' read -r suite tmo wait ends procs scmd ccmd <<<"$row"
    prog=$(program_of "$ccmd")
    rxe="no record"; sim="no record"
    [[ -f $OUT/$suite.log ]] && rxe=$(prog_facts "$OUT/$suite.log" "$prog")
    [[ -f $OUT/$suite.sim ]] && sim=$(prog_facts "$OUT/$suite.sim" "$prog")
    rr=$(head -1 <<<"$rxe"); sr=$(head -1 <<<"$sim")
    # The server exits 0 by itself, or is stopped (qperf), or there is none (fi_info).
    rc_ok='^rc (0|stopped|none) 0$'
    if [[ $rr =~ $rc_ok && $sr == "$rr" && $(sed -n 2p <<<"$rxe") == "$(sed -n 2p <<<"$sim")" ]] \
        && [[ -n $(sed -n 2p <<<"$rxe") ]] && grep -qx 'fabric-rc: 0' "$OUT/$suite.sim"; then
      verdict=same; passed=$((passed + 1))
    else
      verdict=DIFFERENT; failed=$((failed + 1))
    fi
    ratio=$(awk -v s="$(sed -n 3p <<<"$sim")" -v r="$(sed -n 3p <<<"$rxe")" \
      'BEGIN { split(s, a, " "); split(r, b, " "); if (b[1] + 0 > 0 && a[1] != "" && a[2] == b[2]) printf "%.2f", a[1] / b[1]; else print "-" }')
    log "$(printf '%-18s %-9s %s | counts: %s' "${suite#prog-}" "$verdict" "$rr" "$(sed -n 2p <<<"$rxe")")"
    log "$(printf '%-18s %-9s rxe: %s | sim: %s | sim/rxe %s' "" "" "$(sed -n 3p <<<"$rxe")" "$(sed -n 3p <<<"$sim")" "$ratio")"
    [[ -n $(sed -n 4p <<<"$rxe$(echo; sed -n 4p <<<"$sim")") ]] && log "$(printf '%-28s shown only: rxe: %s | sim: %s' "" "$(sed -n 4p <<<"$rxe")" "$(sed -n 4p <<<"$sim")")"
    if [[ $verdict != same ]]; then
      log "  rxe: $(tr '\n' ';' <<<"$rxe") sim: $(tr '\n' ';' <<<"$sim")"
      log "  records: ${OUT#"$REPO"/}/$suite.log (rxe), $suite.sim and $suite.daemon (simulator)"
    fi
  done
}

build_initramfs() {
  log "building initramfs"
  rm -rf "$ROOT" "$OUT"; mkdir -p "$ROOT" "$OUT"
  # Debian 12 is merged-/usr; mirror that so ldd's paths (/lib/..., /lib64/...) resolve.
  local d
  mkdir -p "$ROOT"/{usr/bin,usr/sbin,usr/lib/$MULTIARCH,usr/lib64,proc,sys,dev,tmp,root,etc,lab/suites,lab/bin,lab/modules}
  for d in bin sbin lib lib64; do ln -s usr/$d "$ROOT/$d"; done
  local row
  for row in "${BOOT_GROUPS[@]}"; do : > "$ROOT/lab/suites-${row%%|*}.list"; done

  # iproute2's ip/rdma go to fixed guest paths and are always called by full path:
  # busybox sh runs its own `ip` applet before searching PATH.
  put_elf "$(PATH=$PATH:/usr/sbin:/sbin command -v ip)" /usr/sbin/ip
  put_elf "$(command -v rdma)" /usr/sbin/rdma
  # The rxe verbs provider is dlopen()ed by libibverbs, so ldd of the tools misses it.
  local prov=( /usr/lib/$MULTIARCH/libibverbs/librxe-rdmav*.so )
  ((${#prov[@]})) || die "rxe provider library not found (ibverbs-providers)"
  put_elf "${prov[-1]}"
  put /etc/libibverbs.d/rxe.driver
  # glibc dlopen()s libgcc_s for pthread_exit/cancel unwinding (rping needs it);
  # ldd does not list it for C programs.
  # awk stops reading at the first match; under pipefail ldconfig's SIGPIPE would fail the
  # assignment, so the first match is taken from the whole listing instead.
  local gcc_s; gcc_s=$(ldconfig -p | awk '/libgcc_s.so.1 .*x86-64/ && !found { print $NF; found = 1 }')
  [[ -n $gcc_s ]] || die "libgcc_s.so.1 not found"
  put "$gcc_s"

  # glibc resolves "localhost" through /etc/hosts (without it, through DNS, which the guest has
  # not: EAI_AGAIN); libfabric's verbs provider asks rdma_getaddrinfo for it when no address is
  # given (fi_info's RDM entries, fi_pingpong's server).
  printf '127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n' > "$ROOT/etc/hosts"

  local m
  for m in $(<"$KDIR/modules.load"); do cp "$KDIR/modules/$m.ko" "$ROOT/lab/modules/"; done
  cp "$KDIR/modules.load" "$ROOT/lab/modules.load"

  add_rdmacore_suites
  ((PROJECT)) && add_project_suites && add_interop_suites && add_udaddy_suites && add_mckey_suites
  if ((PROJECT)); then add_dropin_suites; add_perftest_suites; add_program_suites; fi
  add_extra_suites
  # The pair topology's files (its modules, nft and the libraries no other binary brought, its
  # suites) come last and go only into its own image: what they add to the tree is listed and
  # left out of the single group's, which stays what it was.
  local pair_only=$WORK/pair-only.list
  : > "$pair_only"
  if pair_wanted; then
    (cd "$ROOT" && find . -mindepth 1 | sed 's#^\./##' | LC_ALL=C sort) > "$WORK/files.before"
    for m in $(<"$KDIR/modules-pair.load"); do cp "$KDIR/modules/$m.ko" "$ROOT/lab/modules/"; done
    cp "$KDIR/modules-pair.load" "$ROOT/lab/modules-pair.load"
    put_elf "$(PATH=$PATH:/usr/sbin:/sbin command -v nft)" /usr/sbin/nft
    add_pair_suites
    (cd "$ROOT" && find . -mindepth 1 | sed 's#^\./##' | LC_ALL=C sort) | comm -13 "$WORK/files.before" - > "$pair_only"
  fi
  [[ $MODE == shell || ${#SUITE_NAMES[@]} -gt 0 ]] || die "no suites selected (--only '$ONLY')"

  # busybox last: applet links only where no real tool was installed.
  local bb; bb=$(command -v busybox)
  put_elf "$bb" /usr/bin/busybox
  local a
  while IFS= read -r a; do
    [[ -e $ROOT/$a || -L $ROOT/$a ]] || ln -s /usr/bin/busybox "$ROOT/$a"
  done < <("$bb" --list-full)

  write_guest_files
  # One image per boot group: single without the pair-only files, pair with everything.
  local img sizes=""
  rm -f "$WORK"/initramfs*.cpio
  for row in "${BOOT_GROUPS[@]}"; do
    row=${row%%|*}
    [[ $row == single || -s $pair_only ]] || continue
    img=$WORK/$(boot_group_field "$row" 3)
    (cd "$ROOT" && find . -mindepth 1 | sed 's#^\./##' | LC_ALL=C sort \
       | { if [[ $row == single ]]; then grep -vxF -f "$pair_only"; else cat; fi; } \
       | busybox cpio -o -H newc 2>/dev/null) > "$img" || die "cpio failed"
    sizes+="${sizes:+, }$(du -h "$img" | cut -f1) ($row)"
  done
  log "initramfs: $sizes uncompressed, ${#SUITE_NAMES[@]} suite(s): ${SUITE_NAMES[*]}"
}

# The guest side: /init and /lab/lib.sh (helpers for suite scripts) are the
# static files in lab/guest/; /lab/config and /lab/env carry this run's settings.
write_guest_files() {
  local gid_hex
  # rxe publishes the IPv4 address as an IPv4-mapped GID: ...:ffff:0a00:0001
  gid_hex=$(printf '%02x%02x:%02x%02x' ${ADDR//./ })
  cat > "$ROOT/lab/config" <<EOF
ADDR=$ADDR
ADDR_GID=$gid_hex
ADDR6=$ADDR6
ADDR6_GID=$ADDR6_GID
CONNECTIONS=$CONNECTIONS
PAIRS=$PAIRS
EOF
  local kv
  for kv in "${GUEST_ENV[@]}"; do printf 'export %s=%q\n' "${kv%%=*}" "${kv#*=}"; done > "$ROOT/lab/env"

  install -m 644 "$LAB_DIR/guest/lib.sh" "$ROOT/lab/lib.sh"
  install -m 755 "$LAB_DIR/guest/init" "$ROOT/init"
}

# ------------------------------------------------------------------------ VM --
# qemu_cmd TOPOLOGY (a boot group)
qemu_cmd() {
  rm -f "$WORK/qemu.pid"
  # TCG with one thread per vCPU; the uncompressed vmlinux boots via PVH.
  QEMU=(qemu-system-x86_64 -accel tcg,thread=multi -cpu max -M q35 -m "$VM_MEM" -smp "$VM_SMP"
        -no-reboot -nic none -pidfile "$WORK/qemu.pid"
        -kernel "$KDIR/vmlinux" -initrd "$WORK/$(boot_group_field "$1" 3)"
        -append "console=ttyS0 panic=-1 quiet lab.mode=$MODE lab.topology=$1")
}

# Run mode: one VM boot per group with selected suites (booted_groups), one after the other
# (a 2-core host: never two TCG guests at once), each under its own bound.
boot_all() {
  local row g
  # No console of an earlier run left beside this run's (a group that does not boot now).
  for row in "${BOOT_GROUPS[@]}"; do rm -f "$(console_log "${row%%|*}")"; done
  for g in $(booted_groups); do boot_run "$g"; done
}

# boot_run GROUP: qemu in the background writing the console to the group's log
# (lab/work/console.log for single); the foreground follows the log, prints progress and
# enforces the boot bound. The results go to the G_* arrays.
boot_run() {
  local group=$1 vm_timeout
  qemu_cmd "$group"
  CONSOLE_LOG=$(console_log "$group")
  local total=$BOOT_TIMEOUT n
  for n in "${SUITE_NAMES[@]}"; do
    [[ ${SUITE_GROUP[$n]} == "$group" ]] && total=$((total + SUITE_TMO[$n] + 5))
  done
  total=$((total + 30)); ((total <= 1500)) || total=1500   # keep a boot under 30 min
  vm_timeout=${VM_TIMEOUT:-$total}
  if [[ $group == single ]]; then
    log "booting (bound: ${BOOT_TIMEOUT}s to rxe ready, ${vm_timeout}s in all)"
  else
    log "booting the $group topology, $(boot_group_field "$group" 4) (bound: ${BOOT_TIMEOUT}s to rxe ready, ${vm_timeout}s in all; console ${CONSOLE_LOG#"$REPO"/})"
  fi
  : > "$CONSOLE_LOG"
  T0=$EPOCHREALTIME
  timeout -k 10 "$vm_timeout" "${QEMU[@]}" -display none -monitor none -serial stdio \
    < /dev/null > "$CONSOLE_LOG" 2> "$WORK/qemu.stderr" &
  QEMU_PID=$!
  follow_console
  local rc=0
  wait "$QEMU_PID" || rc=$?
  QEMU_PID=""
  VM_SECS=$(elapsed "$T0")
  if ((rc == 124 || rc == 137)); then
    VM_TIMED_OUT=1; log "VM killed after ${VM_SECS}s (bound ${vm_timeout}s)"
  elif ((rc != 0)); then
    log "qemu exited with $rc: $(tail -n 3 "$WORK/qemu.stderr" | tr '\n' ' ')"
  fi
  log "VM finished after ${VM_SECS}s"
  G_INIT[$group]=$BOOT_INIT; G_READY[$group]=$BOOT_READY; G_FAIL[$group]=$BOOT_FAIL
  G_SECS[$group]=$VM_SECS; G_TIMEOUT[$group]=$vm_timeout; G_TIMED_OUT[$group]=$VM_TIMED_OUT
}

# Follow the console log while qemu runs.  `read -t 1` lets us check the boot
# deadline; a timed-out read keeps its partial line, so glue it back together.
follow_console() {
  local line buf="" st deadline_hit=0
  BOOT_INIT=""; BOOT_READY=""; BOOT_FAIL=""; VM_TIMED_OUT=0
  while :; do
    if IFS= read -r -t 1 line; then
      line=$buf$line; buf=""
      on_console_line "${line%$'\r'}"
    else
      st=$?
      ((st > 128)) || break           # EOF: tail saw qemu exit
      buf+=$line
      if [[ -z $BOOT_READY && -z $BOOT_FAIL && $deadline_hit == 0 ]] &&
         (( $(elapsed "$T0" | cut -d. -f1) >= BOOT_TIMEOUT )); then
        deadline_hit=1; BOOT_FAIL="no @@LAB-RXE-READY within ${BOOT_TIMEOUT}s"
        log "$BOOT_FAIL; stopping the VM"
        kill -TERM "$QEMU_PID" 2>/dev/null || true
      fi
    fi
  done < <(tail -n +1 -F --pid="$QEMU_PID" "$CONSOLE_LOG" 2>/dev/null)
}

on_console_line() {
  local line=$1 m
  ((VERBOSE)) && printf '  | %s\n' "$line"
  [[ $line == *@@LAB-* ]] || return 0
  m=${line#*@@LAB-}
  set -- $m
  case $1 in
    INIT)      BOOT_INIT=$(elapsed "$T0"); log "guest init after ${BOOT_INIT}s (guest ${2#t=}s)" ;;
    RXE-READY) BOOT_READY=$(elapsed "$T0"); log "rxe ready after ${BOOT_READY}s (guest ${2#t=}s)" ;;
    RXE-FAIL)  shift; BOOT_FAIL="rxe setup failed: $*"; log "$BOOT_FAIL" ;;
    IPV6-FAIL) shift; log "IPv6 on rxe0 failed (the IPv6 suites will fail): $*" ;;
    BEGIN)     log "suite $2" ;;
    END)       log "suite $2 finished: ${3} (${4#secs=}s)" ;;
    DONE)      log "guest done after $(elapsed "$T0")s" ;;
  esac
}

boot_shell() {
  qemu_cmd "$SHELL_TOPOLOGY"
  VM_TIMEOUT=${VM_TIMEOUT:-$SHELL_TIMEOUT}
  log "booting (shell, $SHELL_TOPOLOGY topology; leave with 'exit' or Ctrl-A x; bound ${VM_TIMEOUT}s; console copy in ${WORK#"$REPO"/}/shell.log)"
  # Serial and monitor multiplexed on the terminal like -nographic, plus a log;
  # signal=off so Ctrl-C goes to the guest shell, not to qemu.
  timeout --foreground -k 10 "$VM_TIMEOUT" "${QEMU[@]}" -display none \
    -chardev "stdio,id=con,mux=on,signal=off,logfile=$WORK/shell.log" \
    -serial chardev:con -mon chardev=con,mode=readline || true
}

# ------------------------------------------------------------------ summary --
# Split console.log into lab/work/out/<suite>.{log,rc,secs}.  A marker may have
# program output glued in front of it (no trailing newline): that part belongs
# to the suite.
split_console() {
  local g
  for g in $(booted_groups); do split_console_log "$(console_log "$g")"; done
}

split_console_log() {
  [[ -f $1 ]] || return 0
  tr -d '\r' < "$1" | awk -v dir="$OUT" '
    {
      line = $0; pre = ""
      i = index(line, "@@LAB-")
      if (i > 1) { pre = substr(line, 1, i - 1); line = substr(line, i) }
      if (i > 0) {
        if (pre != "" && file != "") print pre > file
        split(line, f, " ")
        if (f[1] == "@@LAB-BEGIN") { file = dir "/" f[2] ".log"; printf "" > file; next }
        if (f[1] == "@@LAB-END") {
          rc = f[3]; sub(/^rc=/, "", rc); s = f[4]; sub(/^secs=/, "", s)
          print rc > (dir "/" f[2] ".rc"); print s > (dir "/" f[2] ".secs")
          close(dir "/" f[2] ".rc"); close(dir "/" f[2] ".secs"); close(file); file = ""
        }
        next
      }
      if (file != "") print $0 > file
    }'
}

# libtest: "test result: ok. X passed; Y failed; Z ignored; ..."; lines containing
# "skipped:" are tests that skipped at run time (libtest counts them as passed).
count_libtest() {
  local f=$1 p f_ i s
  read -r p f_ i < <(grep -E '^test result: ' "$f" | sed -E 's/.* ([0-9]+) passed; ([0-9]+) failed; ([0-9]+) ignored.*/\1 \2 \3/' \
                     | awk '{ p += $1; f += $2; i += $3; n++ } END { if (n) print p, f, i }')
  s=$(grep -c 'skipped:' "$f" || true)
  [[ -n $p ]] || return 1
  echo "$((p > s ? p - s : 0)) $f_ $((i + s))"
}

# The hardware runner's own tally (tests/runners/hw.rs prints it last, because libtest
# reports a test that skipped at run time as passed): "N M K" from
# "hw: N passed, M failed, K skipped"; fails when the line is missing.
count_hwrunner() {
  local r
  r=$(grep -E '^hw: [0-9]+ passed, [0-9]+ failed, [0-9]+ skipped' "$1" | tail -1 \
      | sed -E 's/^hw: ([0-9]+) passed, ([0-9]+) failed, ([0-9]+) skipped.*/\1 \2 \3/')
  [[ -n $r ]] || return 1
  echo "$r"
}

# Names listed under libtest's final "failures:" heading.
libtest_failures() {
  awk '/^failures:$/ { grab = 1; names = ""; next }
       grab && /^    [^ ]/ { names = names " " $1; next }
       /^test result:/ { if (names != "") print "      failed tests:" names; grab = 0; names = "" }' "$1"
}

# The cmtime table: the header line whose first word is "step" and the non-blank
# lines after it, up to the first blank line (the suite prints one after the client).
cmtime_table() {
  [[ -f $1 ]] || return 0
  awk 'on && !NF { exit } /^[[:space:]]*step[[:space:]]/ { on = 1 } on' "$1"
}

# A differential suite's table (differential, faultdiff: the suite's name) goes to
# lab/work/NAME-table.txt (with the lines after it: differences, stale list entries, the
# counts); the summary gets its `NAME:` line.
differential_summary() {
  [[ -f $1 ]] || return 0
  local name=$2 line
  awk -v m="--- $name table" 'index($0, m) == 1 { on = 1 } on' "$1" | tr -d '\r' > "$WORK/$name-table.txt"
  line=$(grep -a "^$name: " "$1" | tail -n 1 | tr -d '\r')
  printf '%s (table: %s)' "${line:-no '$name:' line}" "${WORK#"$REPO"/}/$name-table.txt"
}

summarize() {
  split_console
  local passed=0 failed=0 name kind rc secs res detail r
  echo
  log "---------------------------------------------------------------- summary"
  local g what con timed_out=0
  for g in $(booted_groups); do
    what=boot; [[ $g == single ]] || what="boot, $g topology"
    con=$(console_log "$g")
    if [[ -n ${G_READY[$g]:-} ]]; then
      log "$what: guest init ${G_INIT[$g]:-?}s, rxe ready ${G_READY[$g]}s after qemu start; VM total ${G_SECS[$g]}s"
    else
      log "$what: FAILED (${G_FAIL[$g]:-no @@LAB-RXE-READY marker}); console tail (${con#"$REPO"/}):"
      tr -d '\r' < "$con" 2>/dev/null | tail -n 15 | sed 's/^/      | /'
      failed=$((failed + 1))
    fi
    if ((${G_TIMED_OUT[$g]:-0})); then
      timed_out=1; log "VM${what#boot}: killed by its ${G_TIMEOUT[$g]}s bound (--timeout)"
    fi
  done
  for name in "${SUITE_NAMES[@]}"; do
    kind=${SUITE_KIND[$name]}
    rc=$(cat "$OUT/$name.rc" 2>/dev/null || echo "")
    secs=$(cat "$OUT/$name.secs" 2>/dev/null || echo "?")
    detail=""
    if [[ ! -f $OUT/$name.log ]]; then
      res="NOT RUN"; failed=$((failed + 1))
    elif [[ -z $rc ]]; then
      res="NO END (VM died or timed out)"; failed=$((failed + 1)); secs="?"
    elif [[ $kind == hwrunner ]]; then
      # A hardware suite that skipped everything proves nothing: it counts as failed.
      local lf=0
      r=$(count_libtest "$OUT/$name.log") && read -r _ lf _ <<<"$r"
      if r=$(count_hwrunner "$OUT/$name.log"); then
        read -r p f s <<<"$r"
        ((lf > f)) && f=$lf
        passed=$((passed + p)); failed=$((failed + f))
        detail="hw: $p passed, $f failed, $s skipped"
        if ((p == 0 && f == 0)); then failed=$((failed + 1)); detail+=" (the hardware suite did not run)"; fi
        if ((rc != 0 && f == 0)); then failed=$((failed + 1)); detail+=" (but exit code $rc)"; fi
        ((rc == 0 && f == 0 && p > 0)) && res=ok || res=FAIL
      else
        res=FAIL; failed=$((failed + 1 + lf))
        detail="no 'hw: N passed, M failed, K skipped' line from the runner"
        ((rc == 143)) && detail="timed out after ${SUITE_TMO[$name]}s; $detail"
      fi
    elif [[ $kind == echo ]]; then
      # The echo example's last line: "clients: N ok, M failed"; a run without it did not finish.
      r=$(grep -E '^clients: [0-9]+ ok, [0-9]+ failed' "$OUT/$name.log" | tail -1) || true
      if [[ -n $r ]]; then
        detail=$r
        [[ $r == *", 0 failed" ]] && ((rc == 0)) && res=ok || res=FAIL
      else
        res=FAIL; detail="no 'clients: N ok, M failed' line"
        ((rc == 143)) && detail="timed out after ${SUITE_TMO[$name]}s; $detail"
      fi
      if [[ $res == ok ]]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
    elif [[ $kind == libtest ]] && r=$(count_libtest "$OUT/$name.log"); then
      read -r p f s <<<"$r"
      passed=$((passed + p)); failed=$((failed + f))
      detail="tests: $p passed, $f failed, $s skipped"
      if ((rc != 0 && f == 0)); then failed=$((failed + 1)); detail+=" (but exit code $rc)"; fi
      ((rc == 0 && f == 0)) && res=ok || res=FAIL
    else
      if ((rc == 0)); then res=ok; passed=$((passed + 1)); else res=FAIL; failed=$((failed + 1)); fi
      ((rc == 143)) && detail="timed out after ${SUITE_TMO[$name]}s"
      [[ $kind == libtest ]] && detail+="${detail:+; }no libtest result line"
      [[ $kind == differential ]] && detail+="${detail:+; }$(differential_summary "$OUT/$name.log" "$name")"
    fi
    log "$(printf 'suite %-18s %-5s rc=%-4s %7ss  %s' "$name" "$res" "${rc:--}" "$secs" "$detail")"
    if [[ $res != ok && -f $OUT/$name.log ]]; then
      sed 's/^/      | /' "$OUT/$name.log" | tail -n 20
      [[ $kind == libtest || $kind == hwrunner ]] && libtest_failures "$OUT/$name.log"
    fi
    if [[ $kind == criterion && -f $OUT/$name.log ]]; then
      # criterion: "<id>  time: [lo est hi]" (the id is on its own line when long)
      awk '/time:/ { if ($1 == "time:") print "      " prev; print "      " $0 } { prev = $0 }' "$OUT/$name.log"
    fi
  done
  print_cmtime_tables
  print_dropin_comparisons
  print_perftest_comparisons
  print_program_comparisons
  echo
  log "$passed passed, $failed failed"
  ((failed == 0 && timed_out == 0))
}

# Two blocks of lines side by side, the left one padded to its widest line.
side_by_side() {
  awk -v L="$1" -v R="$2" 'BEGIN {
      nl = split(L, l, "\n"); nr = split(R, r, "\n"); w = 0
      for (i = 1; i <= nl; i++) if (length(l[i]) > w) w = length(l[i])
      n = nl > nr ? nl : nr
      for (i = 1; i <= n; i++) printf "%-" w "s | %s\n", (i <= nl ? l[i] : ""), (i <= nr ? r[i] : "")
    }'
}

# The cmtime tables of one run side by side, verbatim: the project's cmtime on the simulator
# and on the hw backend (when they ran), then rdma-core's.
print_cmtime_tables() {
  local titles=() blocks=() suite table
  local -A title=([sim-cmtime]="project, simulator" [cmtime]="project, hw backend" [rdmacore-cmtime]="rdma-core v44"
                  [interop-client]="project client, rdma-core server" [interop-server]="rdma-core client, project server")
  for suite in sim-cmtime cmtime rdmacore-cmtime interop-client interop-server; do
    [[ -n ${SUITE_KIND[$suite]:-} ]] || continue
    table=$(cmtime_table "$OUT/$suite.log")
    titles+=("${title[$suite]}")
    blocks+=("${table:-(no $suite table)}")
  done
  ((${#blocks[@]})) || return 0
  echo
  local heading out i
  heading=$(printf ' | %s' "${titles[@]}"); heading=${heading:3}
  log "cmtime, $CONNECTIONS connections: $heading"
  out=${blocks[0]}
  for ((i = 1; i < ${#blocks[@]}; i++)); do out=$(side_by_side "$out" "${blocks[i]}"); done
  sed 's/^/  /' <<<"$out"
}

# --------------------------------------------------------------------- main --
main() {
  parse_args "$@"
  trap cleanup EXIT
  trap 'exit 130' INT TERM
  mkdir -p "$CACHE" "$WORK"
  # One lab per checkout at a time: they would share lab/work and the console log.
  exec 9> "$WORK/.lock"
  flock -n 9 || die "another lab/lab.sh is running in this checkout"
  log "mode $MODE, connections $CONNECTIONS, project $( ((PROJECT)) && echo yes || echo no)"
  ensure_host_tools
  fetch_kernel
  ((PROJECT)) && build_project
  build_initramfs
  if [[ $MODE == shell ]]; then
    boot_shell
    return 0
  fi
  run_dropin_sims
  run_perftest_sims
  run_program_sims
  boot_all
  summarize
}

# Sourcing the script (for its functions) runs nothing.
if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
  main "$@"
fi

#!/bin/sh
# Reproduces the (B) measurement on Debian 12 (rdma-core 44.0-2: libibverbs1, ibverbs-providers, libibverbs-dev, strace).
set -e
cd "$(dirname "$0")"
F=/tmp/fakesys; rm -rf $F
mkdir -p $F/class/infiniband_verbs/uverbs0 $F/class/infiniband/rxe0
echo 6 > $F/class/infiniband_verbs/abi_version
echo rxe0 > $F/class/infiniband_verbs/uverbs0/ibdev
echo 231:192 > $F/class/infiniband_verbs/uverbs0/dev
echo 2 > $F/class/infiniband_verbs/uverbs0/abi_version
echo 1 > $F/class/infiniband/rxe0/node_type
echo 0211:22ff:fe33:4455 > $F/class/infiniband/rxe0/node_guid
gcc -shared -fPIC -O1 -o /tmp/libshim2.so shim2.c -ldl
gcc -O1 -o /tmp/app app.c -libverbs
SYSFS_PATH=$F SHIM_LOG=1 LD_PRELOAD=/tmp/libshim2.so /tmp/app 1000000
SYSFS_PATH=$F LD_PRELOAD=/tmp/libshim2.so strace -f -o /tmp/trace.txt /tmp/app 1000000 >/dev/null
# syscalls between the getppid() markers: 0 in every phase (the shim absorbs the fake fd's write())
awk '/getppid\(/{if(n)print c" syscalls"; n++; c=0; next} n{c++}' /tmp/trace.txt

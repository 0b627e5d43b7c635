/*
 * Device discovery on the drop-in, run on a fabric host with address ADDR (IPv4):
 * ibv_get_device_list, ibv_open_device, the device/port/GID/P_Key queries and their errors,
 * a PD, CQ and MR on the opened context (by ibv_reg_mr with constant access flags, and by
 * ibv_reg_mr_iova2, which the headers make of ibv_reg_mr with flags known only at run time,
 * and ibv_reg_mr_iova at the region's own address; another iova is EINVAL), ibv_close_device.
 *
 * Exit status 0 when every check passed; prints "devices: ok".
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>

static int bad;

static void check(int ok, const char *what)
{
	if (!ok) {
		fprintf(stderr, "check failed: %s (errno %d)\n", what, errno);
		bad = 1;
	}
}

int main(int argc, char **argv)
{
	struct ibv_device **list;
	struct ibv_context *ctx;
	struct ibv_device_attr attr;
	struct ibv_device_attr_ex attr_ex;
	struct ibv_port_attr port;
	struct ibv_gid_entry entries[4];
	union ibv_gid gid, want;
	struct in_addr v4;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_mr *mr;
	static char buf[4096];
	__be16 pkey;
	int n = -1;

	if (argc != 2 || inet_pton(AF_INET, argv[1], &v4) != 1) {
		fprintf(stderr, "usage: %s IPV4-ADDR\n", argv[0]);
		return 2;
	}
	list = ibv_get_device_list(&n);
	check(list && n == 1 && list[0] && !list[1], "ibv_get_device_list lists one device");
	if (!list || n != 1)
		goto out;
	check(!strcmp(ibv_get_device_name(list[0]), "cmsim0"), "the device is cmsim0");
	check(ibv_get_device_guid(list[0]) != 0, "the device has a node GUID");
	ctx = ibv_open_device(list[0]);
	check(ctx != NULL && ctx->device == list[0], "ibv_open_device");
	if (!ctx)
		goto free_list;

	check(ibv_query_device(ctx, &attr) == 0, "ibv_query_device");
	check(attr.vendor_id == 0xffffff && attr.phys_port_cnt == 1, "rxe's vendor id, one port");
	check(attr.max_qp == (1 << 20) - 16 && attr.max_sge == 32 && attr.max_cqe == 32767,
	      "rxe's max_qp, max_sge, max_cqe");
	check(attr.max_qp_wr == 16384, "the simulator's max_qp_wr");
	check(attr.node_guid == ibv_get_device_guid(list[0]), "node_guid is the device's GUID");
	check(ibv_query_device_ex(ctx, NULL, &attr_ex) == 0 &&
	      attr_ex.orig_attr.max_qp == attr.max_qp &&
	      attr_ex.device_cap_flags_ex == attr.device_cap_flags, "ibv_query_device_ex");

	check(ibv_query_port(ctx, 1, &port) == 0, "ibv_query_port");
	check(port.state == IBV_PORT_ACTIVE && port.link_layer == IBV_LINK_LAYER_ETHERNET,
	      "an active Ethernet port");
	check(port.gid_tbl_len == 1024 && port.pkey_tbl_len == 1, "rxe's table lengths");
	check(ibv_query_port(ctx, 2, &port) == EINVAL, "port 2 is EINVAL");
	check(ibv_query_port(ctx, 0, &port) == EINVAL, "port 0 is EINVAL");

	check(ibv_query_gid(ctx, 1, 0, &gid) == 0, "ibv_query_gid 0");
	check(gid.raw[0] == 0xfe && gid.raw[1] == 0x80, "GID 0 is link-local");
	memset(&want, 0, sizeof(want));
	want.raw[10] = want.raw[11] = 0xff;
	memcpy(&want.raw[12], &v4, 4);
	check(ibv_query_gid(ctx, 1, 1, &gid) == 0 && !memcmp(&gid, &want, sizeof(gid)),
	      "GID 1 is the host's IPv4 address mapped into IPv6");
	memset(&gid, 0xaa, sizeof(gid));
	check(ibv_query_gid(ctx, 1, 2, &gid) == 0 && gid.global.subnet_prefix == 0 &&
	      gid.global.interface_id == 0, "an empty entry of the table is a zero GID");
	errno = 0;
	check(ibv_query_gid(ctx, 1, 1024, &gid) == -1 && errno == EINVAL, "GID 1024 is past the table");
	errno = 0;
	check(ibv_query_gid(ctx, 2, 0, &gid) == -1 && errno == EINVAL, "no GID on port 2");
	check(ibv_query_gid_ex(ctx, 1, 1, &entries[0], 0) == 0 &&
	      entries[0].gid_type == IBV_GID_TYPE_ROCE_V2 && !memcmp(&entries[0].gid, &want, 16),
	      "ibv_query_gid_ex: RoCE v2");
	check(ibv_query_gid_ex(ctx, 1, 2, &entries[0], 0) == ENODATA, "ibv_query_gid_ex: empty");
	check(ibv_query_gid_table(ctx, entries, 4, 0) == 2, "ibv_query_gid_table: two GIDs");
	check(ibv_query_gid_table(ctx, entries, 1, 0) == -EINVAL, "ibv_query_gid_table: no room");

	check(ibv_query_pkey(ctx, 1, 0, &pkey) == 0 && pkey == htons(0xffff), "P_Key 0 is 0xffff");
	errno = 0;
	check(ibv_query_pkey(ctx, 1, 1, &pkey) == -1 && errno == ENOENT, "no P_Key 1");
	check(ibv_get_pkey_index(ctx, 1, htons(0xffff)) == 0, "ibv_get_pkey_index");

	pd = ibv_alloc_pd(ctx);
	check(pd && pd->context == ctx, "ibv_alloc_pd on the opened context");
	cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	check(cq != NULL, "ibv_create_cq on the opened context");
	mr = pd ? ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE) : NULL;
	check(mr != NULL, "ibv_reg_mr on the opened context");
	if (mr)
		check(ibv_dereg_mr(mr) == 0, "ibv_dereg_mr");
	if (pd) {
		volatile int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
		mr = ibv_reg_mr(pd, buf, sizeof(buf), access);
		check(mr && mr->addr == buf && mr->length == sizeof(buf) && mr->lkey,
		      "ibv_reg_mr with run-time flags (ibv_reg_mr_iova2)");
		if (mr)
			check(ibv_dereg_mr(mr) == 0, "ibv_dereg_mr of ibv_reg_mr_iova2's");
		mr = ibv_reg_mr_iova(pd, buf, sizeof(buf), (uintptr_t)buf, IBV_ACCESS_LOCAL_WRITE);
		check(mr && mr->addr == buf, "ibv_reg_mr_iova at the region's address");
		if (mr)
			check(ibv_dereg_mr(mr) == 0, "ibv_dereg_mr of ibv_reg_mr_iova's");
		errno = 0;
		mr = ibv_reg_mr_iova(pd, buf, sizeof(buf), 0x1000, IBV_ACCESS_LOCAL_WRITE);
		check(!mr && errno == EINVAL, "ibv_reg_mr_iova at another iova is EINVAL");
	}
	if (cq)
		check(ibv_destroy_cq(cq) == 0, "ibv_destroy_cq");
	if (pd)
		check(ibv_dealloc_pd(pd) == 0, "ibv_dealloc_pd");
	check(ibv_close_device(ctx) == 0, "ibv_close_device");
free_list:
	ibv_free_device_list(list);
out:
	printf("devices: %s\n", bad ? "FAILED" : "ok");
	return bad;
}

/*
 * The public calls of librdmacm and libibverbs that the drop-in answers without serving, and
 * the small ones it serves.
 *
 *   symbols refused          each refused call answers the error of its C return type
 *                            (-1 as a 64-bit ssize_t, (size_t)-1, an errno value, a negative
 *                            errno, NULL, 0) with its errno; needs no daemon
 *   symbols served           the served pure calls give rdma-core v44's values; without a
 *                            daemon rdma_get_devices is NULL with ENODEV
 *   symbols dump             prints every name, rate and kernel-struct copy, to be compared
 *                            with the same program on rdma-core's own libraries
 *   symbols devices ADDR     on a fabric host: rdma_get_devices, ibv_get_device_name, the
 *                            id's ports and addresses, rdma_join_multicast
 *
 * Exit status 0 when every check passed; the modes but dump print "<mode>: ok".
 */
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <infiniband/sa.h>
#include <infiniband/verbs.h>
#include <rdma/ib_user_sa.h>
#include <rdma/ib_user_verbs.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
#include <rdma/rsocket.h>

/* libibverbs' historical helpers: exported, declared in no installed header. */
const char *ibv_get_sysfs_path(void);
int ibv_dontfork_range(void *base, size_t size);
int ibv_dofork_range(void *base, size_t size);
int ibv_read_sysfs_file(const char *dir, const char *file, char *buf, size_t size);
void ibv_copy_ah_attr_from_kern(struct ibv_ah_attr *dst, struct ib_uverbs_ah_attr *src);
void ibv_copy_qp_attr_from_kern(struct ibv_qp_attr *dst, struct ib_uverbs_qp_attr *src);
void ibv_copy_path_rec_from_kern(struct ibv_sa_path_rec *dst, struct ib_user_path_rec *src);
void ibv_copy_path_rec_to_kern(struct ib_user_path_rec *dst, struct ibv_sa_path_rec *src);

static int bad;

static void check(int ok, const char *what)
{
	if (!ok) {
		fprintf(stderr, "check failed: %s (errno %d)\n", what, errno);
		bad = 1;
	}
}

/* A call whose value and errno are both checked. */
#define WANT(call, want, want_errno)                                                      \
	do {                                                                              \
		errno = 0;                                                                \
		long long got_ = (long long)(call);                                       \
		int err_ = errno;                                                         \
		if (got_ != (long long)(want) || err_ != (want_errno)) {                  \
			fprintf(stderr, "check failed: %s gave %lld errno %d, want %lld errno %d\n", \
				#call, got_, err_, (long long)(want), (want_errno));      \
			bad = 1;                                                          \
		}                                                                         \
	} while (0)

#define WANT_STR(call, want)                                                              \
	do {                                                                              \
		const char *got_ = (call);                                                \
		if (!got_ || strcmp(got_, (want)) != 0) {                                 \
			fprintf(stderr, "check failed: %s gave \"%s\", want \"%s\"\n", #call,  \
				got_ ? got_ : "(null)", (want));                          \
			bad = 1;                                                          \
		}                                                                         \
	} while (0)

static int refused(void)
{
	char buf[8];
	struct iovec iov = { .iov_base = buf, .iov_len = sizeof(buf) };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
	struct sockaddr_in sin = { .sin_family = AF_INET };
	socklen_t len = sizeof(sin);
	struct ibv_async_event aev;
	struct ibv_ece ece = { 0 };
	struct ibv_ah_attr ah = { 0 };
	union ibv_gid gid = { { 0 } };
	uint8_t mac[6];
	uint16_t vid;

	/* int: -1 and errno */
	WANT(rbind(3, (struct sockaddr *)&sin, sizeof(sin)), -1, ENOSYS);
	WANT(rgetpeername(3, (struct sockaddr *)&sin, &len), -1, ENOSYS);
	WANT(rselect(0, NULL, NULL, NULL, NULL), -1, ENOSYS);
	WANT(riounmap(3, buf, sizeof(buf)), -1, ENOSYS);
	WANT(rdma_notify(NULL, IBV_EVENT_COMM_EST), -1, ENOSYS);
	WANT(rdma_reject_ece(NULL, NULL, 0), -1, ENOSYS);
	WANT(rdma_set_local_ece(NULL, &ece), -1, ENOSYS);
	WANT(ibv_get_async_event(NULL, &aev), -1, ENOSYS);
	WANT(ibv_read_sysfs_file("/sys", "kernel/mm", buf, sizeof(buf)), -1, ENOSYS);

	/* ssize_t: -1 in all 64 bits */
	WANT(rrecv(3, buf, sizeof(buf), 0), -1, ENOSYS);
	WANT(rsend(3, buf, sizeof(buf), 0), -1, ENOSYS);
	WANT(rread(3, buf, sizeof(buf)), -1, ENOSYS);
	WANT(rreadv(3, &iov, 1), -1, ENOSYS);
	WANT(rrecvfrom(3, buf, sizeof(buf), 0, (struct sockaddr *)&sin, &len), -1, ENOSYS);
	WANT(rrecvmsg(3, &msg, 0), -1, ENOSYS);
	WANT(rsendto(3, buf, sizeof(buf), 0, (struct sockaddr *)&sin, sizeof(sin)), -1, ENOSYS);
	WANT(rsendmsg(3, &msg, 0), -1, ENOSYS);
	WANT(rwrite(3, buf, sizeof(buf)), -1, ENOSYS);
	WANT(rwritev(3, &iov, 1), -1, ENOSYS);

	/* off_t and size_t */
	WANT(riomap(3, buf, sizeof(buf), 0, 0, 0) == (off_t)-1, 1, ENOSYS);
	WANT(riowrite(3, buf, sizeof(buf), 0, 0) == (size_t)-1, 1, ENOSYS);

	/* int: the errno value itself */
	WANT(ibv_attach_mcast(NULL, &gid, 0), ENOSYS, ENOSYS);
	WANT(ibv_resize_cq(NULL, 16), ENOSYS, ENOSYS);
	WANT(ibv_query_ece(NULL, &ece), EOPNOTSUPP, EOPNOTSUPP);

	/* a negative errno, and ibv_rereg_mr's error code */
	WANT(ibv_resolve_eth_l2_from_gid(NULL, &ah, mac, &vid), -ENOSYS, ENOSYS);
	WANT(ibv_rereg_mr(NULL, 0, NULL, NULL, 0, 0), IBV_REREG_MR_ERR_CMD, ENOSYS);

	/* pointers: NULL and errno */
	WANT(ibv_import_pd(NULL, 1) == NULL, 1, ENOSYS);
	WANT(ibv_get_sysfs_path() == NULL, 1, ENOSYS);

	/* 1 means "in order": a refusal must promise nothing */
	WANT(ibv_query_qp_data_in_order(NULL, IBV_WR_RDMA_WRITE, 0), 0, ENOSYS);

	/* void: only the line on stderr */
	ibv_ack_async_event(&aev);
	ibv_unimport_pd(NULL);

	printf("refused: %s\n", bad ? "FAILED" : "ok");
	return bad;
}

static int served(void)
{
	static char page[4096] __attribute__((aligned(4096)));
	void (*register_driver)(const char *, void *);
	int n = 7;

	WANT_STR(ibv_wc_status_str(IBV_WC_SUCCESS), "success");
	WANT_STR(ibv_wc_status_str(IBV_WC_WR_FLUSH_ERR), "Work Request Flushed Error");
	WANT_STR(ibv_wc_status_str(IBV_WC_TM_RNDV_INCOMPLETE), "TM software rendezvous");
	WANT_STR(ibv_wc_status_str(IBV_WC_TM_RNDV_INCOMPLETE + 1), "unknown");
	WANT_STR(ibv_wc_status_str(-1), "unknown");
	WANT_STR(ibv_event_type_str(IBV_EVENT_CQ_ERR), "CQ error");
	WANT_STR(ibv_event_type_str(IBV_EVENT_WQ_FATAL), "WQ fatal");
	WANT_STR(ibv_event_type_str(IBV_EVENT_WQ_FATAL + 1), "unknown");
	WANT_STR(ibv_node_type_str(IBV_NODE_CA), "InfiniBand channel adapter");
	WANT_STR(ibv_node_type_str(IBV_NODE_UNSPECIFIED), "unspecified");
	WANT_STR(ibv_node_type_str(0), "unknown");
	WANT_STR(ibv_node_type_str(IBV_NODE_UNKNOWN), "unknown");
	WANT_STR(ibv_port_state_str(IBV_PORT_NOP), "no state change (NOP)");
	WANT_STR(ibv_port_state_str(IBV_PORT_ACTIVE_DEFER), "active defer");
	WANT_STR(ibv_port_state_str(IBV_PORT_ACTIVE_DEFER + 1), "unknown");
	WANT_STR(rdma_event_str(RDMA_CM_EVENT_TIMEWAIT_EXIT), "RDMA_CM_EVENT_TIMEWAIT_EXIT");
	WANT_STR(rdma_event_str(RDMA_CM_EVENT_TIMEWAIT_EXIT + 1), "UNKNOWN EVENT");

	WANT(ibv_rate_to_mult(IBV_RATE_2_5_GBPS), 1, 0);
	WANT(ibv_rate_to_mult(IBV_RATE_1200_GBPS), 480, 0);
	WANT(ibv_rate_to_mult(IBV_RATE_14_GBPS), -1, 0);
	WANT(ibv_rate_to_mult(IBV_RATE_MAX), -1, 0);
	WANT(mult_to_ibv_rate(11), IBV_RATE_28_GBPS, 0);
	WANT(mult_to_ibv_rate(3), IBV_RATE_MAX, 0);
	WANT(ibv_rate_to_mbps(IBV_RATE_14_GBPS), 14062, 0);
	WANT(ibv_rate_to_mbps(IBV_RATE_100_GBPS), 103125, 0);
	WANT(ibv_rate_to_mbps(IBV_RATE_MAX), -1, 0);
	WANT(mbps_to_ibv_rate(53125), IBV_RATE_50_GBPS, 0);
	WANT(mbps_to_ibv_rate(50000), IBV_RATE_MAX, 0);

	WANT(ibv_fork_init(), 0, 0);
	WANT(ibv_is_fork_initialized(), IBV_FORK_UNNEEDED, 0);
	WANT(ibv_dontfork_range(page, sizeof(page)), 0, 0);
	WANT(ibv_dofork_range(page, sizeof(page)), 0, 0);
	/* A compat-only symbol of libibverbs (no default version to link against). */
	register_driver = (void (*)(const char *, void *))dlsym(RTLD_DEFAULT, "ibv_register_driver");
	check(register_driver != NULL, "ibv_register_driver is exported");
	if (register_driver)
		register_driver("cmsim-test", NULL);

	/* Without a daemon there is no device: the reason is on stderr and in errno. */
	WANT(rdma_get_devices(&n) == NULL, 1, ENODEV);
	check(n == 0, "rdma_get_devices sets *num_devices to 0");

	printf("served: %s\n", bad ? "FAILED" : "ok");
	return bad;
}

static void fill(void *p, size_t len, int seed)
{
	for (size_t i = 0; i < len; i++)
		((unsigned char *)p)[i] = (unsigned char)(seed + 7 * i);
}

static void hex(const char *what, const void *p, size_t len)
{
	printf("%s", what);
	for (size_t i = 0; i < len; i++)
		printf("%s%02x", i % 8 ? "" : " ", ((const unsigned char *)p)[i]);
	printf("\n");
}

static int dump(void)
{
	static const int mbps[] = { 2500, 5000, 10000, 20000, 30000, 40000, 60000, 80000,
				    120000, 14062, 56250, 112500, 168750, 25781, 103125, 206250,
				    309375, 28125, 53125, 425000, 637500, 850000, 1275000 };
	struct ib_uverbs_ah_attr kah;
	struct ib_uverbs_qp_attr kqp;
	struct ib_user_path_rec kpath;
	struct ibv_ah_attr ah;
	struct ibv_qp_attr qp;
	struct ibv_sa_path_rec path;

	for (int i = -2; i < 30; i++)
		printf("%d wc \"%s\" event \"%s\" node \"%s\" port \"%s\" cm \"%s\"\n", i,
		       ibv_wc_status_str(i), ibv_event_type_str(i), ibv_node_type_str(i),
		       ibv_port_state_str(i), rdma_event_str(i));
	for (int i = -2; i < 30; i++)
		printf("rate %d mult %d mbps %d\n", i, ibv_rate_to_mult(i), ibv_rate_to_mbps(i));
	for (int m = -2; m <= 500; m++)
		if (mult_to_ibv_rate(m) != IBV_RATE_MAX)
			printf("mult %d rate %d\n", m, mult_to_ibv_rate(m));
	for (size_t i = 0; i < sizeof(mbps) / sizeof(mbps[0]); i++)
		for (int d = -1; d <= 1; d++)
			printf("mbps %d rate %d\n", mbps[i] + d, mbps_to_ibv_rate(mbps[i] + d));

	for (int seed = 1; seed <= 3; seed++) {
		fill(&kah, sizeof(kah), seed);
		memset(&ah, 0xaa, sizeof(ah));
		ibv_copy_ah_attr_from_kern(&ah, &kah);
		hex("ah_from_kern", &ah, sizeof(ah));

		fill(&kqp, sizeof(kqp), seed + 10);
		memset(&qp, 0xaa, sizeof(qp));
		ibv_copy_qp_attr_from_kern(&qp, &kqp);
		hex("qp_from_kern", &qp, sizeof(qp));

		fill(&kpath, sizeof(kpath), seed + 20);
		memset(&path, 0xaa, sizeof(path));
		ibv_copy_path_rec_from_kern(&path, &kpath);
		hex("path_from_kern", &path, sizeof(path));

		fill(&path, sizeof(path), seed + 30);
		memset(&kpath, 0xaa, sizeof(kpath));
		ibv_copy_path_rec_to_kern(&kpath, &path);
		hex("path_to_kern", &kpath, sizeof(kpath));
	}
	return 0;
}

static struct rdma_cm_event *next_event(struct rdma_event_channel *ch, enum rdma_cm_event_type want)
{
	struct rdma_cm_event *ev = NULL;

	check(rdma_get_cm_event(ch, &ev) == 0, "rdma_get_cm_event");
	if (ev && (ev->event != want || ev->status != 0)) {
		fprintf(stderr, "got %s status %d, wanted %s\n", rdma_event_str(ev->event),
			ev->status, rdma_event_str(want));
		bad = 1;
	}
	return ev;
}

static int devices(const char *addr)
{
	struct sockaddr_in src = { .sin_family = AF_INET, .sin_port = htons(7471) };
	struct sockaddr_in group = { .sin_family = AF_INET, .sin_port = htons(7555) };
	struct sockaddr *(*local_addr)(struct rdma_cm_id *);
	struct sockaddr *(*peer_addr)(struct rdma_cm_id *);
	struct rdma_event_channel *ch;
	struct rdma_cm_id *id, *ud;
	struct ibv_context **list;
	struct rdma_cm_event *ev;
	int n = 0;

	inet_pton(AF_INET, addr, &src.sin_addr);
	inet_pton(AF_INET, "239.1.2.3", &group.sin_addr);

	list = rdma_get_devices(&n);
	check(list != NULL && n == 1, "rdma_get_devices lists one device");
	if (list && n == 1) {
		check(list[1] == NULL, "the list ends with NULL");
		WANT_STR(ibv_get_device_name(list[0]->device), "cmsim0");
		rdma_free_devices(list);
	}

	ch = rdma_create_event_channel();
	check(ch != NULL, "rdma_create_event_channel");
	if (!ch)
		goto out;
	check(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0, "rdma_create_id");
	check(rdma_get_src_port(id) == 0, "an unbound id has no source port");
	check(rdma_bind_addr(id, (struct sockaddr *)&src) == 0, "rdma_bind_addr");
	check(rdma_get_src_port(id) == htons(7471), "rdma_get_src_port is the bound port");
	check(rdma_get_dst_port(id) == 0, "a bound id has no destination port");
	/* rdma_cma.h makes these inline; the exported ones are what a lookup by name finds. */
	local_addr = (struct sockaddr * (*)(struct rdma_cm_id *)) dlsym(RTLD_DEFAULT, "rdma_get_local_addr");
	peer_addr = (struct sockaddr * (*)(struct rdma_cm_id *)) dlsym(RTLD_DEFAULT, "rdma_get_peer_addr");
	check(local_addr && local_addr(id) == &id->route.addr.src_addr, "rdma_get_local_addr");
	check(peer_addr && peer_addr(id) == &id->route.addr.dst_addr, "rdma_get_peer_addr");

	check(rdma_create_id(ch, &ud, NULL, RDMA_PS_UDP) == 0, "rdma_create_id (UDP)");
	src.sin_port = 0;
	check(rdma_resolve_addr(ud, (struct sockaddr *)&src, (struct sockaddr *)&group, 2000) == 0,
	      "rdma_resolve_addr to a group");
	ev = next_event(ch, RDMA_CM_EVENT_ADDR_RESOLVED);
	if (ev)
		rdma_ack_cm_event(ev);
	check(rdma_get_dst_port(ud) == htons(7555), "rdma_get_dst_port is the group's port");
	check(rdma_join_multicast(ud, (struct sockaddr *)&group, NULL) == 0, "rdma_join_multicast");
	ev = next_event(ch, RDMA_CM_EVENT_MULTICAST_JOIN);
	if (ev)
		rdma_ack_cm_event(ev);
	check(rdma_leave_multicast(ud, (struct sockaddr *)&group) == 0, "rdma_leave_multicast");
	rdma_destroy_id(ud);
	rdma_destroy_id(id);
	rdma_destroy_event_channel(ch);
out:
	printf("devices: %s\n", bad ? "FAILED" : "ok");
	return bad;
}

int main(int argc, char **argv)
{
	if (argc == 2 && !strcmp(argv[1], "refused"))
		return refused();
	if (argc == 2 && !strcmp(argv[1], "served"))
		return served();
	if (argc == 2 && !strcmp(argv[1], "dump"))
		return dump();
	if (argc == 3 && !strcmp(argv[1], "devices"))
		return devices(argv[2]);
	fprintf(stderr, "usage: %s refused|served|dump|devices ADDR\n", argv[0]);
	return 2;
}

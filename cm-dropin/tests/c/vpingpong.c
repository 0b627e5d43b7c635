/* A verbs RC ping-pong in the style of rdma-core's ibv_rc_pingpong: the QP is made with
 * ibv_create_qp and moved RESET -> INIT -> RTR -> RTS with ibv_modify_qp; the two processes
 * tell each other their QP number, PSN and GID out of band (a line on stdout, the peer's line
 * on stdin) instead of over TCP.
 *
 *   vpingpong server|client ITERATIONS
 *
 * Prints "local QP ... " first, then checks along the way and ends with "vpingpong: ok N". */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <infiniband/verbs.h>

#define MSG 64
#define PORT 1
#define GID_INDEX 1

static int fail(const char *what, int err)
{
	printf("vpingpong: %s failed: %s\n", what, strerror(err));
	fflush(stdout);
	exit(1);
}

static struct ibv_cq *cq;
static struct ibv_qp *qp;
static char buf[2][MSG];
static struct ibv_mr *mr;

static void post_recv(void)
{
	struct ibv_sge sge = { .addr = (uintptr_t)buf[1], .length = MSG, .lkey = mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1 }, *bad;
	int ret = ibv_post_recv(qp, &wr, &bad);
	if (ret)
		fail("ibv_post_recv", ret);
}

static void post_send(const char *text)
{
	snprintf(buf[0], MSG, "%s", text);
	struct ibv_sge sge = { .addr = (uintptr_t)buf[0], .length = (uint32_t)strlen(text) + 1, .lkey = mr->lkey };
	struct ibv_send_wr wr = {
		.wr_id = 2, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED,
	}, *bad;
	int ret = ibv_post_send(qp, &wr, &bad);
	if (ret)
		fail("ibv_post_send", ret);
}

/* The next completion, within 20 s. */
static struct ibv_wc next_wc(void)
{
	struct ibv_wc wc;
	time_t until = time(NULL) + 20;
	for (;;) {
		int n = ibv_poll_cq(cq, 1, &wc);
		if (n < 0)
			fail("ibv_poll_cq", -n);
		if (n == 1)
			return wc;
		if (time(NULL) > until) {
			printf("vpingpong: no completion within 20 s\n");
			exit(1);
		}
		usleep(100);
	}
}

/* Waits for one send and one receive completion (either order); checks the receive holds
 * `want`. */
static void exchange(const char *want)
{
	int got_send = 0, got_recv = 0;
	while (!got_send || !got_recv) {
		struct ibv_wc wc = next_wc();
		if (wc.status != IBV_WC_SUCCESS) {
			printf("vpingpong: completion %s for wr %llu\n", ibv_wc_status_str(wc.status),
			       (unsigned long long)wc.wr_id);
			exit(1);
		}
		if (wc.qp_num != qp->qp_num) {
			printf("vpingpong: completion names QP %u, not %u\n", wc.qp_num, qp->qp_num);
			exit(1);
		}
		if (wc.opcode == IBV_WC_RECV) {
			if (strcmp(buf[1], want) != 0 || wc.byte_len != strlen(want) + 1) {
				printf("vpingpong: received \"%s\" (%u bytes), wanted \"%s\"\n", buf[1], wc.byte_len, want);
				exit(1);
			}
			got_recv = 1;
		} else {
			got_send = 1;
		}
	}
}

static void gid_text(const union ibv_gid *gid, char *out)
{
	for (int i = 0; i < 16; i++)
		sprintf(out + 2 * i, "%02x", gid->raw[i]);
}

static void gid_parse(const char *text, union ibv_gid *gid)
{
	for (int i = 0; i < 16; i++) {
		unsigned v;
		sscanf(text + 2 * i, "%2x", &v);
		gid->raw[i] = (uint8_t)v;
	}
}

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: vpingpong server|client ITERATIONS\n");
		return 2;
	}
	int server = strcmp(argv[1], "server") == 0;
	int iters = atoi(argv[2]);
	struct ibv_device **list = ibv_get_device_list(NULL);
	if (!list || !list[0])
		fail("ibv_get_device_list", errno);
	struct ibv_context *ctx = ibv_open_device(list[0]);
	if (!ctx)
		fail("ibv_open_device", errno);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	if (!pd || !mr || !cq)
		fail("pd, mr or cq", errno);
	struct ibv_qp_init_attr init_attr = {
		.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	qp = ibv_create_qp(pd, &init_attr);
	if (!qp)
		fail("ibv_create_qp", errno);
	if (qp->state != IBV_QPS_RESET || init_attr.cap.max_send_wr < 4)
		fail("a new QP in RESET with its caps", EINVAL);

	/* RESET -> RTR skips INIT: the kernel's EINVAL. */
	struct ibv_qp_attr attr = { .qp_state = IBV_QPS_RTR };
	if (ibv_modify_qp(qp, &attr, IBV_QP_STATE) != EINVAL)
		fail("refusing RESET -> RTR", EINVAL);

	attr = (struct ibv_qp_attr){
		.qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = PORT,
		.qp_access_flags = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE,
	};
	int ret = ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
	if (ret)
		fail("ibv_modify_qp INIT", ret);

	union ibv_gid gid;
	if (ibv_query_gid(ctx, PORT, GID_INDEX, &gid))
		fail("ibv_query_gid", errno);
	srand48(getpid() * time(NULL));
	unsigned psn = lrand48() & 0xffffff;
	char gtext[33];
	gid_text(&gid, gtext);
	printf("QP %06x PSN %06x GID %s\n", qp->qp_num, psn, gtext);
	fflush(stdout);

	unsigned rqpn, rpsn;
	char rgid_text[64];
	if (scanf("QP %x PSN %x GID %32s", &rqpn, &rpsn, rgid_text) != 3)
		fail("reading the peer's QP, PSN and GID", EINVAL);
	union ibv_gid rgid;
	gid_parse(rgid_text, &rgid);

	post_recv();

	attr = (struct ibv_qp_attr){
		.qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024, .dest_qp_num = rqpn, .rq_psn = rpsn,
		.max_dest_rd_atomic = 1, .min_rnr_timer = 12,
		.ah_attr = { .is_global = 1, .port_num = PORT,
			     .grh = { .dgid = rgid, .sgid_index = GID_INDEX, .hop_limit = 1 } },
	};
	int rtr_mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
		       IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
	/* Without its destination, RTR is refused and the QP stays in INIT. */
	if (ibv_modify_qp(qp, &attr, rtr_mask & ~IBV_QP_DEST_QPN) != EINVAL)
		fail("refusing RTR without IBV_QP_DEST_QPN", EINVAL);
	ret = ibv_modify_qp(qp, &attr, rtr_mask);
	if (ret)
		fail("ibv_modify_qp RTR", ret);
	attr = (struct ibv_qp_attr){
		.qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 7, .rnr_retry = 7, .sq_psn = psn,
		.max_rd_atomic = 1,
	};
	ret = ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
						 IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
	if (ret)
		fail("ibv_modify_qp RTS", ret);

	struct ibv_qp_attr q;
	struct ibv_qp_init_attr qi;
	if (ibv_query_qp(qp, &q, IBV_QP_STATE | IBV_QP_DEST_QPN, &qi))
		fail("ibv_query_qp", errno);
	if (q.qp_state != IBV_QPS_RTS || q.dest_qp_num != rqpn || q.sq_psn != psn || q.rq_psn != rpsn ||
	    q.timeout != 14 || q.path_mtu != IBV_MTU_1024 || qi.qp_type != IBV_QPT_RC)
		fail("ibv_query_qp's answer", EINVAL);

	char msg[MSG];
	int sends_done = 0;
	for (int i = 0; i < iters; i++) {
		if (server) {
			/* The ping's receive was posted; an earlier pong's send may complete first. */
			snprintf(msg, MSG, "ping %d", i);
			struct ibv_wc wc;
			for (;;) {
				wc = next_wc();
				if (wc.status != IBV_WC_SUCCESS)
					fail(ibv_wc_status_str(wc.status), EIO);
				if (wc.opcode == IBV_WC_RECV)
					break;
				sends_done++;
			}
			if (strcmp(buf[1], msg) != 0) {
				printf("vpingpong: wanted \"%s\", got \"%s\"\n", msg, buf[1]);
				return 1;
			}
			post_recv();
			snprintf(msg, MSG, "pong %d", i);
			post_send(msg);
		} else {
			snprintf(msg, MSG, "ping %d", i);
			post_send(msg);
			snprintf(msg, MSG, "pong %d", i);
			exchange(msg);
			post_recv();
		}
	}
	while (server && sends_done < iters) {
		struct ibv_wc wc = next_wc();
		if (wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_SEND)
			fail("a pong's send", EIO);
		sends_done++;
	}

	/* ERR flushes the receive still posted. */
	attr = (struct ibv_qp_attr){ .qp_state = IBV_QPS_ERR };
	ret = ibv_modify_qp(qp, &attr, IBV_QP_STATE);
	if (ret)
		fail("ibv_modify_qp ERR", ret);
	struct ibv_wc wc = next_wc();
	if (wc.status != IBV_WC_WR_FLUSH_ERR)
		fail("the flush of the posted receive", EIO);
	if (ibv_query_qp(qp, &q, IBV_QP_STATE, &qi) || q.qp_state != IBV_QPS_ERR)
		fail("ibv_query_qp in ERR", EINVAL);
	if (ibv_destroy_qp(qp) || ibv_destroy_cq(cq) || ibv_dereg_mr(mr) || ibv_dealloc_pd(pd))
		fail("tearing down", errno);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	printf("vpingpong: ok %d\n", iters);
	return 0;
}

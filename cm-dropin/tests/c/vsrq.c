/* Shared receive queues of verbs QPs on one simulated host: rxe's refusals of ibv_create_srq
 * and ibv_modify_srq, receives drained from one SRQ by two QPs (each completion naming its
 * QP, the wr_id posted and the bytes in the buffer posted with it), ibv_post_srq_recv's
 * refusals (EINVAL past max_sge, ENOMEM past max_wr), ibv_post_recv refused on a QP with an
 * SRQ, and ibv_destroy_srq refused (EBUSY) while a QP uses it.
 *
 * Prints "vsrq: ok" at the end, or what failed. */
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

static void fail(const char *what, int err)
{
	printf("vsrq: %s: %s\n", what, strerror(err));
	fflush(stdout);
	exit(1);
}

static struct ibv_cq *cq;
static char buf[5][MSG];
static struct ibv_mr *mr;

/* The next completion, within 20 s. */
static struct ibv_wc next_wc(void)
{
	struct ibv_wc wc;
	time_t until = time(NULL) + 20;
	for (;;) {
		int n = ibv_poll_cq(cq, 1, &wc);
		if (n < 0)
			fail("ibv_poll_cq", -n);
		if (n == 1 && wc.status != IBV_WC_SUCCESS) {
			printf("vsrq: completion %s for wr %llu\n", ibv_wc_status_str(wc.status),
			       (unsigned long long)wc.wr_id);
			exit(1);
		}
		if (n == 1)
			return wc;
		if (time(NULL) > until) {
			printf("vsrq: no completion within 20 s\n");
			exit(1);
		}
		usleep(100);
	}
}

static void connect_qp(struct ibv_qp *qp, uint32_t dest, const union ibv_gid *gid)
{
	struct ibv_qp_attr attr = {
		.qp_state = IBV_QPS_INIT, .port_num = PORT,
		.qp_access_flags = IBV_ACCESS_LOCAL_WRITE,
	};
	if (ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		fail("ibv_modify_qp INIT", EINVAL);
	attr = (struct ibv_qp_attr){
		.qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024, .dest_qp_num = dest, .rq_psn = 1,
		.max_dest_rd_atomic = 1, .min_rnr_timer = 12,
		.ah_attr = { .is_global = 1, .port_num = PORT,
			     .grh = { .dgid = *gid, .sgid_index = GID_INDEX, .hop_limit = 1 } },
	};
	if (ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
					     IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		fail("ibv_modify_qp RTR", EINVAL);
	attr = (struct ibv_qp_attr){
		.qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 7, .rnr_retry = 7, .sq_psn = 1,
		.max_rd_atomic = 1,
	};
	if (ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
					     IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
		fail("ibv_modify_qp RTS", EINVAL);
}

static void send_text(struct ibv_qp *qp, const char *text)
{
	snprintf(buf[0], MSG, "%s", text);
	struct ibv_sge sge = { .addr = (uintptr_t)buf[0], .length = (uint32_t)strlen(text) + 1, .lkey = mr->lkey };
	struct ibv_send_wr wr = {
		.wr_id = 1, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED,
	}, *bad;
	if (ibv_post_send(qp, &wr, &bad))
		fail("ibv_post_send", EINVAL);
}

/* The send's completion and a receive completion on `qp` for `wr_id`, whose buffer `slot`
 * holds `text`, in either order. */
static void expect_recv(struct ibv_qp *qp, uint64_t wr_id, int slot, const char *text)
{
	struct ibv_wc wc = next_wc();
	if (wc.opcode == IBV_WC_SEND)
		wc = next_wc();
	else if (next_wc().opcode != IBV_WC_SEND)
		fail("the send's completion", EINVAL);
	if (wc.opcode != IBV_WC_RECV)
		fail("a receive completion", EINVAL);
	if (wc.qp_num != qp->qp_num || wc.wr_id != wr_id || wc.byte_len != strlen(text) + 1 ||
	    strcmp(buf[slot], text) != 0) {
		printf("vsrq: receive on QP %u for wr %llu (%u bytes, \"%s\"), wanted QP %u, wr %llu, \"%s\"\n",
		       wc.qp_num, (unsigned long long)wc.wr_id, wc.byte_len, buf[slot], qp->qp_num,
		       (unsigned long long)wr_id, text);
		exit(1);
	}
}

int main(void)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	if (!list || !list[0])
		fail("ibv_get_device_list", errno);
	struct ibv_context *ctx = ibv_open_device(list[0]);
	if (!ctx)
		fail("ibv_open_device", errno);
	struct ibv_device_attr dev;
	if (ibv_query_device(ctx, &dev))
		fail("ibv_query_device", errno);
	if (dev.max_srq <= 0 || dev.max_srq_wr <= 0 || dev.max_srq_sge <= 0)
		fail("the device's SRQ limits", EINVAL);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	if (!pd || !mr || !cq)
		fail("pd, mr or cq", errno);

	/* rxe_srq_chk_init: max_wr 1..max_srq_wr, max_sge up to max_srq_sge. */
	struct ibv_srq_init_attr sa = { .attr = { .max_wr = (uint32_t)dev.max_srq_wr + 1, .max_sge = 1 } };
	if (ibv_create_srq(pd, &sa) || errno != EINVAL)
		fail("refusing max_wr past max_srq_wr", EINVAL);
	sa = (struct ibv_srq_init_attr){ .attr = { .max_wr = 0, .max_sge = 1 } };
	if (ibv_create_srq(pd, &sa) || errno != EINVAL)
		fail("refusing max_wr 0", EINVAL);
	sa = (struct ibv_srq_init_attr){ .attr = { .max_wr = 4, .max_sge = (uint32_t)dev.max_srq_sge + 1 } };
	if (ibv_create_srq(pd, &sa) || errno != EINVAL)
		fail("refusing max_sge past max_srq_sge", EINVAL);
	/* A limit's event would come by ibv_get_async_event, which the simulator lacks. */
	sa = (struct ibv_srq_init_attr){ .attr = { .max_wr = 4, .max_sge = 1, .srq_limit = 2 } };
	if (ibv_create_srq(pd, &sa) || errno != EOPNOTSUPP)
		fail("refusing an srq_limit (no asynchronous events)", EINVAL);

	sa = (struct ibv_srq_init_attr){ .srq_context = buf, .attr = { .max_wr = 16, .max_sge = 1 } };
	struct ibv_srq *srq = ibv_create_srq(pd, &sa);
	if (!srq)
		fail("ibv_create_srq", errno);
	if (sa.attr.max_wr < 16 || srq->srq_context != buf || srq->context != ctx || srq->pd != pd)
		fail("the SRQ as made", EINVAL);
	struct ibv_srq_attr q;
	if (ibv_query_srq(srq, &q) || q.max_wr != sa.attr.max_wr || q.max_sge != 1 || q.srq_limit != 0)
		fail("ibv_query_srq", EINVAL);
	/* rxe_srq_chk_attr. */
	struct ibv_srq_attr m = { .srq_limit = sa.attr.max_wr + 1 };
	if (ibv_modify_srq(srq, &m, IBV_SRQ_LIMIT) != EINVAL)
		fail("refusing a limit above max_wr", EINVAL);
	m = (struct ibv_srq_attr){ .max_wr = (uint32_t)dev.max_srq_wr + 1 };
	if (ibv_modify_srq(srq, &m, IBV_SRQ_MAX_WR) != EINVAL)
		fail("refusing a resize past max_srq_wr", EINVAL);
	m = (struct ibv_srq_attr){ .max_wr = 32 };
	if (ibv_modify_srq(srq, &m, IBV_SRQ_MAX_WR) != EOPNOTSUPP)
		fail("refusing a resize (no IBV_DEVICE_SRQ_RESIZE)", EINVAL);
	m = (struct ibv_srq_attr){ .srq_limit = 0 };
	if (ibv_modify_srq(srq, &m, IBV_SRQ_LIMIT))
		fail("disarming the limit", EINVAL);

	/* A full SRQ: rxe's ENOMEM, naming the request that did not fit. */
	sa = (struct ibv_srq_init_attr){ .attr = { .max_wr = 2, .max_sge = 1 } };
	struct ibv_srq *small = ibv_create_srq(pd, &sa);
	if (!small)
		fail("ibv_create_srq", errno);
	struct ibv_sge one = { .addr = (uintptr_t)buf[4], .length = MSG, .lkey = mr->lkey };
	struct ibv_recv_wr fill[3];
	for (int i = 0; i < 3; i++)
		fill[i] = (struct ibv_recv_wr){ .wr_id = i, .sg_list = &one, .num_sge = 1,
						.next = i < 2 ? &fill[i + 1] : NULL };
	struct ibv_recv_wr *bad_fill = NULL;
	if (ibv_post_srq_recv(small, fill, &bad_fill) != ENOMEM || bad_fill != &fill[2])
		fail("refusing a receive past max_wr", EINVAL);
	if (ibv_destroy_srq(small))
		fail("ibv_destroy_srq of an SRQ with receives posted", EINVAL);

	union ibv_gid gid;
	if (ibv_query_gid(ctx, PORT, GID_INDEX, &gid))
		fail("ibv_query_gid", errno);
	struct ibv_qp *rx[2], *tx[2];
	for (int i = 0; i < 2; i++) {
		struct ibv_qp_init_attr on = {
			.send_cq = cq, .recv_cq = cq, .srq = srq, .qp_type = IBV_QPT_RC,
			.cap = { .max_send_wr = 2, .max_send_sge = 1 },
		};
		rx[i] = ibv_create_qp(pd, &on);
		if (!rx[i])
			fail("ibv_create_qp on the SRQ", errno);
		if (rx[i]->srq != srq || on.cap.max_recv_wr != 0)
			fail("a QP on an SRQ, with no receive queue of its own", EINVAL);
		struct ibv_qp_init_attr own = {
			.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
			.cap = { .max_send_wr = 2, .max_recv_wr = 2, .max_send_sge = 1, .max_recv_sge = 1 },
		};
		tx[i] = ibv_create_qp(pd, &own);
		if (!tx[i])
			fail("ibv_create_qp", errno);
	}
	for (int i = 0; i < 2; i++) {
		connect_qp(rx[i], tx[i]->qp_num, &gid);
		connect_qp(tx[i], rx[i]->qp_num, &gid);
	}

	/* rxe's post_recv on a QP with an SRQ: EINVAL. */
	struct ibv_sge sge = { .addr = (uintptr_t)buf[4], .length = MSG, .lkey = mr->lkey };
	struct ibv_recv_wr own_wr = { .wr_id = 9, .sg_list = &sge, .num_sge = 1 }, *bad = NULL;
	if (ibv_post_recv(rx[0], &own_wr, &bad) != EINVAL)
		fail("refusing ibv_post_recv on a QP with an SRQ", EINVAL);

	/* Three receives, each with its buffer, in one list. */
	struct ibv_sge sges[3];
	struct ibv_recv_wr wrs[3];
	for (int i = 0; i < 3; i++) {
		sges[i] = (struct ibv_sge){ .addr = (uintptr_t)buf[1 + i], .length = MSG, .lkey = mr->lkey };
		wrs[i] = (struct ibv_recv_wr){ .wr_id = 100 + i, .sg_list = &sges[i], .num_sge = 1,
					       .next = i < 2 ? &wrs[i + 1] : NULL };
	}
	if (ibv_post_srq_recv(srq, wrs, &bad))
		fail("ibv_post_srq_recv", EINVAL);
	/* rxe's post_one_recv: more entries than max_sge is EINVAL, naming the request. */
	struct ibv_sge two[2] = { sges[0], sges[1] };
	struct ibv_recv_wr wide = { .wr_id = 7, .sg_list = two, .num_sge = 2 };
	bad = NULL;
	if (ibv_post_srq_recv(srq, &wide, &bad) != EINVAL || bad != &wide)
		fail("refusing a receive of more entries than max_sge", EINVAL);
	/* Whichever QP a message comes to takes the SRQ's oldest receive. */
	send_text(tx[1], "to the second");
	expect_recv(rx[1], 100, 1, "to the second");
	send_text(tx[0], "to the first");
	expect_recv(rx[0], 101, 2, "to the first");
	send_text(tx[1], "second again");
	expect_recv(rx[1], 102, 3, "second again");

	if (ibv_destroy_srq(srq) != EBUSY)
		fail("refusing ibv_destroy_srq while QPs use it", EINVAL);
	if (ibv_destroy_qp(rx[0]))
		fail("ibv_destroy_qp", errno);
	if (ibv_destroy_srq(srq) != EBUSY)
		fail("refusing ibv_destroy_srq while a QP uses it", EINVAL);
	for (int i = 0; i < 2; i++)
		if ((i == 1 && ibv_destroy_qp(rx[i])) || ibv_destroy_qp(tx[i]))
			fail("ibv_destroy_qp", errno);
	if (ibv_destroy_srq(srq))
		fail("ibv_destroy_srq", EINVAL);
	if (ibv_destroy_cq(cq) || ibv_dereg_mr(mr) || ibv_dealloc_pd(pd))
		fail("tearing down", EINVAL);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	printf("vsrq: ok\n");
	return 0;
}

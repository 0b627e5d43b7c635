/*
 * An SRQ on an rdma_cm id: the server makes it with rdma_create_srq before its QP, whose
 * rdma_create_qp then takes it (ibv_qp_init_attr.srq left NULL, as librdmacm fills it in), and
 * posts its receives with rdma_post_recv, which goes to the SRQ; the client sends two
 * messages, which land in the SRQ's receives in posting order, each completion naming the
 * server's QP. ibv_destroy_srq is EBUSY while the QP lives; rdma_destroy_srq clears id->srq.
 *
 *   cmsrq server ADDR     serves one connection
 *   cmsrq client ADDR     connects and sends
 *
 * Prints "server: ok" / "client: ok" when every check passed.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>

static char in[2][32], out[2][32];

static int fail(const char *what)
{
	perror(what);
	return 1;
}

static int check(int ok, const char *what)
{
	if (!ok)
		fprintf(stderr, "check failed: %s\n", what);
	return !ok;
}

int main(int argc, char **argv)
{
	struct rdma_addrinfo hints, *res;
	struct ibv_qp_init_attr attr;
	struct rdma_cm_id *listen_id, *id;
	struct ibv_wc wc;
	int server, i, ret, bad = 0;

	if (argc != 3)
		return 2;
	server = !strcmp(argv[1], "server");
	memset(&hints, 0, sizeof hints);
	hints.ai_port_space = RDMA_PS_TCP;
	if (server)
		hints.ai_flags = RAI_PASSIVE;
	if (rdma_getaddrinfo(argv[2], "7471", &hints, &res))
		return fail("rdma_getaddrinfo");
	memset(&attr, 0, sizeof attr);
	attr.cap.max_send_wr = attr.cap.max_recv_wr = 4;
	attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
	attr.sq_sig_all = 1;
	if (!server) {
		if (rdma_create_ep(&id, res, NULL, &attr))
			return fail("rdma_create_ep");
		struct ibv_mr *mr = rdma_reg_msgs(id, out, sizeof out);
		if (!mr)
			return fail("rdma_reg_msgs");
		if (rdma_connect(id, NULL))
			return fail("rdma_connect");
		for (i = 0; i < 2; i++) {
			snprintf(out[i], sizeof out[i], "message %d", i);
			if (rdma_post_send(id, NULL, out[i], sizeof out[i], mr, 0))
				return fail("rdma_post_send");
			while ((ret = rdma_get_send_comp(id, &wc)) == 0)
				;
			if (ret < 0)
				return fail("rdma_get_send_comp");
			bad |= check(wc.status == IBV_WC_SUCCESS, "the send completes");
		}
		/* The server disconnects once it has both. */
		struct rdma_cm_event *ev;
		if (rdma_get_cm_event(id->channel, &ev))
			return fail("rdma_get_cm_event");
		bad |= check(ev->event == RDMA_CM_EVENT_DISCONNECTED, "the server disconnects");
		rdma_ack_cm_event(ev);
		rdma_disconnect(id);
		rdma_dereg_mr(mr);
		rdma_destroy_ep(id);
		printf("client: %s\n", bad ? "FAILED" : "ok");
		return bad;
	}

	if (rdma_create_ep(&listen_id, res, NULL, NULL))
		return fail("rdma_create_ep");
	if (rdma_listen(listen_id, 1))
		return fail("rdma_listen");
	if (rdma_get_request(listen_id, &id))
		return fail("rdma_get_request");
	bad |= check(id->qp == NULL, "no QP before rdma_create_qp");

	struct ibv_srq_init_attr sa = { .attr = { .max_wr = 8, .max_sge = 1 } };
	if (rdma_create_srq(id, NULL, &sa))
		return fail("rdma_create_srq");
	bad |= check(id->srq != NULL && sa.attr.max_wr >= 8, "id->srq is the new SRQ");
	if (rdma_create_qp(id, NULL, &attr))
		return fail("rdma_create_qp");
	bad |= check(attr.srq == id->srq && id->qp->srq == id->srq, "the QP takes the id's SRQ");
	bad |= check(attr.cap.max_recv_wr == 0, "no receive queue of its own");

	struct ibv_mr *mr = rdma_reg_msgs(id, in, sizeof in);
	if (!mr)
		return fail("rdma_reg_msgs");
	for (i = 0; i < 2; i++)
		if (rdma_post_recv(id, (void *)(uintptr_t)(100 + i), in[i], sizeof in[i], mr))
			return fail("rdma_post_recv");
	if (rdma_accept(id, NULL))
		return fail("rdma_accept");
	for (i = 0; i < 2; i++) {
		char want[32];
		snprintf(want, sizeof want, "message %d", i);
		while ((ret = rdma_get_recv_comp(id, &wc)) == 0)
			;
		if (ret < 0)
			return fail("rdma_get_recv_comp");
		bad |= check(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV, "a receive completes");
		bad |= check(wc.wr_id == 100 + (uint64_t)i, "the SRQ's receives are taken in posting order");
		bad |= check(wc.qp_num == id->qp->qp_num, "the completion names the QP");
		bad |= check(wc.byte_len == sizeof out[i] && !strcmp(in[i], want),
			     "the bytes land in the receive's buffer");
	}
	ret = ibv_destroy_srq(id->srq);
	bad |= check(ret == EBUSY, "ibv_destroy_srq is EBUSY while the QP uses the SRQ");
	rdma_disconnect(id);
	rdma_destroy_qp(id);
	rdma_destroy_srq(id);
	bad |= check(id->srq == NULL, "rdma_destroy_srq clears id->srq");
	rdma_dereg_mr(mr);
	rdma_destroy_ep(id);
	rdma_destroy_ep(listen_id);
	printf("server: %s\n", bad ? "FAILED" : "ok");
	return bad;
}

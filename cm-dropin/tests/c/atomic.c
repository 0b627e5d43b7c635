/*
 * The two atomics over an RC QP of librdmacm's synchronous endpoints, checked value by value:
 * the server tells its 8-byte target (5) by a message; the client fetches-and-adds 10 (reads
 * 5), compares-and-swaps 15 for 100 (reads 15, swaps), compares-and-swaps 1 for 7 (reads 100,
 * does not swap), then says done; the server finds 100.
 *
 *   atomic server ADDR
 *   atomic client ADDR
 *
 * Prints "SIDE: ok" when every check passed; a message on stderr otherwise.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>

struct where {
	uint64_t addr;
	uint32_t rkey;
};

static uint64_t target __attribute__((aligned(8))) = 5;
static uint64_t old __attribute__((aligned(8)));
static struct where msg;

static int fail(const char *what)
{
	perror(what);
	exit(1);
}

static int check(int ok, const char *what)
{
	if (!ok)
		fprintf(stderr, "check failed: %s\n", what);
	return !ok;
}

static struct ibv_wc wait_send(struct rdma_cm_id *id)
{
	struct ibv_wc wc;
	int ret;
	while ((ret = rdma_get_send_comp(id, &wc)) == 0)
		;
	if (ret < 0)
		fail("rdma_get_send_comp");
	return wc;
}

static struct ibv_wc wait_recv(struct rdma_cm_id *id)
{
	struct ibv_wc wc;
	int ret;
	while ((ret = rdma_get_recv_comp(id, &wc)) == 0)
		;
	if (ret < 0)
		fail("rdma_get_recv_comp");
	return wc;
}

/* One atomic on the server's target; the value it read. */
static uint64_t atomic(struct rdma_cm_id *id, struct ibv_mr *mr, enum ibv_wr_opcode op, uint64_t compare_add,
		       uint64_t swap, int *bad)
{
	struct ibv_sge sge = { (uintptr_t)&old, sizeof old, mr->lkey };
	struct ibv_send_wr wr = { .wr_id = op, .sg_list = &sge, .num_sge = 1, .opcode = op,
				  .send_flags = IBV_SEND_SIGNALED }, *bad_wr;
	struct ibv_wc wc;

	wr.wr.atomic.remote_addr = msg.addr;
	wr.wr.atomic.rkey = msg.rkey;
	wr.wr.atomic.compare_add = compare_add;
	wr.wr.atomic.swap = swap;
	old = 0xdead;
	if (ibv_post_send(id->qp, &wr, &bad_wr))
		fail("ibv_post_send");
	wc = wait_send(id);
	*bad |= check(wc.status == IBV_WC_SUCCESS && wc.wr_id == (uint64_t)op, "the atomic completes");
	*bad |= check(wc.opcode == (op == IBV_WR_ATOMIC_CMP_AND_SWP ? IBV_WC_COMP_SWAP : IBV_WC_FETCH_ADD),
		      "its completion's opcode");
	return old;
}

int main(int argc, char **argv)
{
	struct rdma_addrinfo hints, *res;
	struct ibv_qp_init_attr attr;
	struct rdma_conn_param param;
	struct rdma_cm_id *listen_id, *id;
	struct ibv_mr *m_msg, *m_target;
	int server, bad = 0;

	if (argc != 3)
		return 2;
	server = !strcmp(argv[1], "server");
	memset(&hints, 0, sizeof hints);
	hints.ai_port_space = RDMA_PS_TCP;
	if (server)
		hints.ai_flags = RAI_PASSIVE;
	if (rdma_getaddrinfo(argv[2], "7471", &hints, &res))
		fail("rdma_getaddrinfo");
	memset(&attr, 0, sizeof attr);
	attr.cap.max_send_wr = attr.cap.max_recv_wr = 4;
	attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
	attr.sq_sig_all = 1;
	if (rdma_create_ep(server ? &listen_id : &id, res, NULL, &attr))
		fail("rdma_create_ep");
	memset(&param, 0, sizeof param);
	param.responder_resources = param.initiator_depth = 1;
	if (server) {
		if (rdma_listen(listen_id, 1))
			fail("rdma_listen");
		if (rdma_get_request(listen_id, &id))
			fail("rdma_get_request");
	}
	m_msg = rdma_reg_msgs(id, &msg, sizeof msg);
	m_target = ibv_reg_mr(id->pd, server ? (void *)&target : (void *)&old, sizeof target,
			      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_ATOMIC);
	if (!m_msg || !m_target)
		fail("rdma_reg_msgs/ibv_reg_mr");
	if (server) {
		if (rdma_post_recv(id, NULL, &msg, sizeof msg, m_msg))
			fail("rdma_post_recv");
		if (rdma_accept(id, &param))
			fail("rdma_accept");
		msg.addr = (uintptr_t)&target;
		msg.rkey = m_target->rkey;
		if (rdma_post_send(id, NULL, &msg, sizeof msg, m_msg, 0))
			fail("rdma_post_send");
		wait_send(id);
		wait_recv(id);
		bad |= check(target == 100, "the target holds the swapped value");
	} else {
		if (rdma_post_recv(id, NULL, &msg, sizeof msg, m_msg))
			fail("rdma_post_recv");
		if (rdma_connect(id, &param))
			fail("rdma_connect");
		wait_recv(id);
		bad |= check(atomic(id, m_target, IBV_WR_ATOMIC_FETCH_AND_ADD, 10, 0, &bad) == 5,
			     "fetch and add reads the value before");
		bad |= check(atomic(id, m_target, IBV_WR_ATOMIC_CMP_AND_SWP, 15, 100, &bad) == 15,
			     "compare and swap reads the value it matched");
		bad |= check(atomic(id, m_target, IBV_WR_ATOMIC_CMP_AND_SWP, 1, 7, &bad) == 100,
			     "compare and swap that does not match reads the value and leaves it");
		if (rdma_post_send(id, NULL, &msg, sizeof msg, m_msg, 0))
			fail("rdma_post_send");
		wait_send(id);
	}
	rdma_disconnect(id);
	printf("%s: %s\n", argv[1], bad ? "FAILED" : "ok");
	return bad;
}

/*
 * A message and its transformed echo over synchronous librdmacm endpoints, checked byte for
 * byte: gather from several SGEs, scatter across SGE boundaries, byte_len, and an unsignaled
 * send whose success is not reported (sq_sig_all = 0), the client's send carrying an immediate
 * (IBV_WR_SEND_WITH_IMM) that the server's completion reports with the QP's own number.
 *
 *   echo server ADDR     serves one connection
 *   echo client ADDR     connects, sends, checks the echo
 *
 * Exit status 0 when every check passed; a message on stderr otherwise.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
#include <arpa/inet.h>

#define IMM 0x12345678u /* the client's immediate, in host order */

#define LEN 6000 /* bytes of the big message */

static unsigned char out1[LEN / 2], out2[LEN / 2]; /* what is sent, in two SGEs */
static unsigned char in1[1000], in2[2500], in3[2500]; /* where it lands, in three */
static unsigned char hello[16];

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

static unsigned char pattern(int i)
{
	return (unsigned char)(i * 7 + 1);
}

static int wait_send(struct rdma_cm_id *id, struct ibv_wc *wc)
{
	int ret;

	while ((ret = rdma_get_send_comp(id, wc)) == 0)
		;
	return ret < 0;
}

static int wait_recv(struct rdma_cm_id *id, struct ibv_wc *wc)
{
	int ret;

	while ((ret = rdma_get_recv_comp(id, wc)) == 0)
		;
	return ret < 0;
}

int main(int argc, char **argv)
{
	struct rdma_addrinfo hints, *res;
	struct ibv_qp_init_attr attr;
	struct rdma_cm_id *listen_id, *id;
	struct ibv_mr *m_out1, *m_out2, *m_in1, *m_in2, *m_in3, *m_hello;
	struct ibv_wc wc;
	int server, i, bad = 0;

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
	attr.cap.max_send_sge = attr.cap.max_recv_sge = 3;
	attr.sq_sig_all = 0;
	if (rdma_create_ep(server ? &listen_id : &id, res, NULL, &attr))
		return fail("rdma_create_ep");
	if (server) {
		if (rdma_listen(listen_id, 1))
			return fail("rdma_listen");
		if (rdma_get_request(listen_id, &id))
			return fail("rdma_get_request");
	}
	m_out1 = rdma_reg_msgs(id, out1, sizeof out1);
	m_out2 = rdma_reg_msgs(id, out2, sizeof out2);
	m_in1 = rdma_reg_msgs(id, in1, sizeof in1);
	m_in2 = rdma_reg_msgs(id, in2, sizeof in2);
	m_in3 = rdma_reg_msgs(id, in3, sizeof in3);
	m_hello = rdma_reg_msgs(id, hello, sizeof hello);
	if (!m_out1 || !m_out2 || !m_in1 || !m_in2 || !m_in3 || !m_hello)
		return fail("rdma_reg_msgs");

	struct ibv_sge in[3] = {
		{ (uintptr_t)in1, sizeof in1, m_in1->lkey },
		{ (uintptr_t)in2, sizeof in2, m_in2->lkey },
		{ (uintptr_t)in3, sizeof in3, m_in3->lkey },
	};
	struct ibv_sge out[2] = {
		{ (uintptr_t)out1, sizeof out1, m_out1->lkey },
		{ (uintptr_t)out2, sizeof out2, m_out2->lkey },
	};
	struct ibv_recv_wr rwr = { .wr_id = 10, .sg_list = in, .num_sge = 3 }, *bad_rwr;
	struct ibv_send_wr swr = { .wr_id = 20, .sg_list = out, .num_sge = 2,
				   .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED }, *bad_swr;

	if (server) {
		if (ibv_post_recv(id->qp, &rwr, &bad_rwr))
			return fail("ibv_post_recv");
		if (rdma_accept(id, NULL))
			return fail("rdma_accept");
		if (wait_recv(id, &wc))
			return fail("rdma_get_recv_comp");
		bad |= check(wc.status == IBV_WC_SUCCESS && wc.wr_id == 10, "server receive completes");
		bad |= check(wc.byte_len == LEN, "server receives the whole message");
		bad |= check((wc.wc_flags & IBV_WC_WITH_IMM) && ntohl(wc.imm_data) == IMM,
			     "server's completion carries the client's immediate");
		bad |= check(wc.qp_num == id->qp->qp_num, "server's completion names its own QP");
		for (i = 0; i < LEN; i++) {
			unsigned char got = i < 1000 ? in1[i] : i < 3500 ? in2[i - 1000] : in3[i - 3500];
			if (got != pattern(i)) {
				bad |= check(0, "server receives the pattern");
				break;
			}
		}
		/* An unsignaled hello, then the echo (every byte xor 0x5a), signaled. */
		memcpy(hello, "unsignaled hello", 16);
		if (rdma_post_send(id, (void *)1, hello, sizeof hello, m_hello, 0))
			return fail("rdma_post_send");
		for (i = 0; i < LEN; i++)
			(i < LEN / 2 ? out1 : out2)[i % (LEN / 2)] = pattern(i) ^ 0x5a;
		if (ibv_post_send(id->qp, &swr, &bad_swr))
			return fail("ibv_post_send");
		if (wait_send(id, &wc))
			return fail("rdma_get_send_comp");
		bad |= check(wc.status == IBV_WC_SUCCESS && wc.wr_id == 20,
			     "only the signaled send reports its completion");
		rdma_disconnect(id);
	} else {
		if (rdma_post_recv(id, (void *)2, hello, sizeof hello, m_hello))
			return fail("rdma_post_recv");
		if (ibv_post_recv(id->qp, &rwr, &bad_rwr))
			return fail("ibv_post_recv");
		if (rdma_connect(id, NULL))
			return fail("rdma_connect");
		for (i = 0; i < LEN; i++)
			(i < LEN / 2 ? out1 : out2)[i % (LEN / 2)] = pattern(i);
		swr.opcode = IBV_WR_SEND_WITH_IMM;
		swr.imm_data = htonl(IMM);
		if (ibv_post_send(id->qp, &swr, &bad_swr))
			return fail("ibv_post_send");
		if (wait_send(id, &wc))
			return fail("rdma_get_send_comp");
		bad |= check(wc.status == IBV_WC_SUCCESS && wc.wr_id == 20 && wc.byte_len == LEN,
			     "client send completes with its length as byte_len, as on rxe");
		if (wait_recv(id, &wc))
			return fail("rdma_get_recv_comp");
		bad |= check(wc.wr_id == 2 && wc.byte_len == 16 && !memcmp(hello, "unsignaled hello", 16),
			     "the unsignaled hello arrives first");
		if (wait_recv(id, &wc))
			return fail("rdma_get_recv_comp");
		bad |= check(wc.wr_id == 10 && wc.byte_len == LEN, "the echo arrives whole");
		bad |= check(!(wc.wc_flags & IBV_WC_WITH_IMM), "a plain send carries no immediate");
		for (i = 0; i < LEN; i++) {
			unsigned char got = i < 1000 ? in1[i] : i < 3500 ? in2[i - 1000] : in3[i - 3500];
			if (got != (pattern(i) ^ 0x5a)) {
				bad |= check(0, "client receives the transformed pattern");
				break;
			}
		}
		rdma_disconnect(id);
	}
	printf("%s: %s\n", argv[1], bad ? "FAILED" : "ok");
	return bad;
}

/*
 * rdma_getaddrinfo without a daemon: the rules are cm-core's (ports, the wildcard of a passive
 * lookup, the hints' family), names are the system resolver's.
 *
 * Exit status 0 when every check passed; a message on stderr otherwise.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <arpa/inet.h>
#include <rdma/rdma_cma.h>

static int check(int ok, const char *what)
{
	if (!ok)
		fprintf(stderr, "check failed: %s (errno %d)\n", what, errno);
	return !ok;
}

static int lookup(const char *node, const char *service, int flags, int family,
		  struct rdma_addrinfo **res)
{
	struct rdma_addrinfo hints;

	memset(&hints, 0, sizeof hints);
	hints.ai_flags = flags;
	hints.ai_family = family;
	hints.ai_port_space = RDMA_PS_TCP;
	errno = 0;
	return rdma_getaddrinfo(node, service, &hints, res);
}

static const char *ip_of(const struct sockaddr *sa, char *buf, socklen_t len)
{
	const void *a = sa->sa_family == AF_INET ? (const void *)&((struct sockaddr_in *)sa)->sin_addr
						 : (const void *)&((struct sockaddr_in6 *)sa)->sin6_addr;
	return inet_ntop(sa->sa_family, a, buf, len);
}

int main(void)
{
	struct rdma_addrinfo *res;
	char ip[64];
	int bad = 0;

	bad |= check(lookup("10.0.0.1", "7471", 0, 0, &res) == 0 && res->ai_dst_addr &&
		     !strcmp(ip_of(res->ai_dst_addr, ip, sizeof ip), "10.0.0.1") &&
		     ntohs(((struct sockaddr_in *)res->ai_dst_addr)->sin_port) == 7471 && !res->ai_src_addr,
		     "an active lookup gives the destination");
	if (!bad)
		rdma_freeaddrinfo(res);
	bad |= check(lookup(NULL, "7471", RAI_PASSIVE, 0, &res) == 0 && res->ai_src_addr &&
		     !strcmp(ip_of(res->ai_src_addr, ip, sizeof ip), "0.0.0.0"),
		     "a passive lookup without a node listens on the wildcard");
	if (!bad)
		rdma_freeaddrinfo(res);
	bad |= check(lookup("localhost", "1", 0, AF_INET, &res) == 0 &&
		     !strcmp(ip_of(res->ai_dst_addr, ip, sizeof ip), "127.0.0.1"),
		     "a name goes through the system resolver");
	if (!bad)
		rdma_freeaddrinfo(res);
	bad |= check(lookup("10.0.0.1", "7471", 0, AF_INET6, &res) != 0 && errno == EINVAL,
		     "an IPv4 node for an AF_INET6 lookup is EINVAL");
	bad |= check(lookup("10.0.0.1", "http", 0, 0, &res) != 0 && errno == EINVAL,
		     "a service that is not a port number is EINVAL");
	bad |= check(lookup("localhost", "1", RAI_NUMERICHOST, 0, &res) != 0 && errno == EINVAL,
		     "RAI_NUMERICHOST refuses a name");
	{
		/* Neither node nor service: the hints' own addresses and fields (libfabric's
		 * verbs provider asks so for an address it has). */
		struct rdma_addrinfo hints;
		struct sockaddr_in dst = { .sin_family = AF_INET, .sin_port = htons(7471) };
		struct sockaddr_in src = { .sin_family = AF_INET };

		inet_pton(AF_INET, "10.0.0.2", &dst.sin_addr);
		inet_pton(AF_INET, "10.0.0.1", &src.sin_addr);
		memset(&hints, 0, sizeof hints);
		hints.ai_flags = RAI_FAMILY;
		hints.ai_family = AF_INET;
		hints.ai_qp_type = IBV_QPT_RC;
		hints.ai_port_space = RDMA_PS_TCP;
		hints.ai_dst_addr = (struct sockaddr *)&dst;
		hints.ai_dst_len = sizeof dst;
		hints.ai_src_addr = (struct sockaddr *)&src;
		hints.ai_src_len = sizeof src;
		errno = 0;
		bad |= check(rdma_getaddrinfo(NULL, NULL, &hints, &res) == 0 &&
			     res->ai_flags == RAI_FAMILY && res->ai_family == AF_INET &&
			     res->ai_port_space == RDMA_PS_TCP && res->ai_dst_len == sizeof dst &&
			     !strcmp(ip_of(res->ai_dst_addr, ip, sizeof ip), "10.0.0.2") &&
			     ntohs(((struct sockaddr_in *)res->ai_dst_addr)->sin_port) == 7471 &&
			     res->ai_src_len == sizeof src &&
			     !strcmp(ip_of(res->ai_src_addr, ip, sizeof ip), "10.0.0.1"),
			     "without node and service the hints' addresses come back");
		if (!bad)
			rdma_freeaddrinfo(res);
		bad |= check(rdma_getaddrinfo(NULL, NULL, NULL, &res) != 0 && errno == EINVAL,
			     "without node, service and hints: EINVAL");
	}
	printf("%s\n", bad ? "FAILED" : "ok");
	return bad;
}

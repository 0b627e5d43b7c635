#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <sys/syscall.h>
#define MARK(s) syscall(SYS_getppid)  /* marker syscall visible in strace */
int main(int argc,char**argv){ long N=argc>1?atol(argv[1]):1000000; int n; struct ibv_device**l=ibv_get_device_list(&n); if(!n){puts("no dev");return 1;}
 struct ibv_context*c=ibv_open_device(l[0]); if(!c){puts("open failed");return 1;}
 struct ibv_pd*pd=ibv_alloc_pd(c); struct ibv_cq*cq=ibv_create_cq(c,16,NULL,NULL,0); if(!pd||!cq){puts("pd/cq failed");return 1;}
 struct ibv_qp_init_attr ia={.send_cq=cq,.recv_cq=cq,.qp_type=IBV_QPT_RC,.cap={.max_send_wr=16,.max_recv_wr=16,.max_send_sge=1,.max_recv_sge=1}};
 struct ibv_qp*qp=ibv_create_qp(pd,&ia); if(!qp){puts("qp failed");return 1;}
 struct ibv_qp_attr at={.qp_state=IBV_QPS_INIT,.port_num=1}; if(ibv_modify_qp(qp,&at,IBV_QP_STATE|IBV_QP_PKEY_INDEX|IBV_QP_PORT|IBV_QP_ACCESS_FLAGS)){puts("modify failed");return 1;}
 static char buf[64]; struct ibv_sge sge={.addr=(uintptr_t)buf,.length=64,.lkey=1}; struct ibv_wc wc; long got=0;
 MARK(); for(long i=0;i<N;i++) got+=ibv_poll_cq(cq,1,&wc); MARK();
 struct ibv_recv_wr rw={.wr_id=1,.sg_list=&sge,.num_sge=1},*brw; for(int i=0;i<10;i++) if(ibv_post_recv(qp,&rw,&brw)){puts("post_recv failed");return 1;} MARK();
 struct ibv_send_wr sw={.wr_id=2,.sg_list=&sge,.num_sge=1,.opcode=IBV_WR_SEND,.send_flags=IBV_SEND_SIGNALED},*bsw; for(int i=0;i<10;i++) if(ibv_post_send(qp,&sw,&bsw)){puts("post_send failed");return 1;} MARK();
 ibv_req_notify_cq(cq,0); MARK();
 printf("polls=%ld completions=%ld\n",N,got); return 0; }

#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/socket.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>
#include <stdint.h>
#include <linux/netlink.h>
#include <rdma/rdma_user_ioctl.h>
#include <rdma/ib_user_verbs.h>
#include <rdma/rdma_user_rxe.h>
/* Minimal emulation of /dev/infiniband/uverbs0 for the distribution's librxe: write() commands only
   (every ioctl answers ENOTTY so libibverbs falls back to write), queues are anonymous shared maps. */
static int fake_fd=-1; static unsigned next_handle=1;
struct pend { uint64_t off; uint32_t size, log2, n; } pend[64]; static int npend; static uint64_t next_off=0x1000;
static unsigned long counts[64];
#define LOG(...) do{ if(getenv("SHIM_LOG")) fprintf(stderr,"[shim] " __VA_ARGS__);}while(0)
static int is_dev(const char*p){return p && strncmp(p,"/dev/infiniband/",16)==0;}
static void add_q(struct mminfo*mi,uint32_t log2,uint32_t n){ mi->offset=next_off; mi->size=sizeof(struct rxe_queue_buf)+(n<<log2); mi->size=(mi->size+4095)&~4095u; pend[npend++]=(struct pend){next_off,mi->size,log2,n}; next_off+=0x100000; }
int socket(int d,int t,int p){static int(*r)(int,int,int); if(!r)r=dlsym(RTLD_NEXT,"socket");
  if(d==AF_NETLINK && p==NETLINK_RDMA){errno=EPROTONOSUPPORT; return -1;} return r(d,t,p);}
int stat(const char*p,struct stat*s){static int(*r)(const char*,struct stat*); if(!r)r=dlsym(RTLD_NEXT,"stat");
  if(is_dev(p)){memset(s,0,sizeof *s); s->st_mode=S_IFCHR|0666; s->st_rdev=makedev(231,192); return 0;} return r(p,s);}
int open(const char*p,int f,...){static int(*r)(const char*,int,...); if(!r)r=dlsym(RTLD_NEXT,"open"); va_list a; va_start(a,f); int m=va_arg(a,int); va_end(a);
  if(is_dev(p)){fake_fd=memfd_create("uverbs",MFD_CLOEXEC); return fake_fd;} return r(p,f,m);}
int fstat(int fd,struct stat*s){static int(*r)(int,struct stat*); if(!r)r=dlsym(RTLD_NEXT,"fstat");
  if(fd==fake_fd && fd>=0){memset(s,0,sizeof *s); s->st_mode=S_IFCHR|0666; s->st_rdev=makedev(231,192); return 0;} return r(fd,s);}
int ioctl(int fd,unsigned long req,...){static int(*r)(int,unsigned long,...); if(!r)r=dlsym(RTLD_NEXT,"ioctl"); va_list a; va_start(a,req); void*arg=va_arg(a,void*); va_end(a);
  if(fd==fake_fd && fd>=0){ counts[63]++; errno=ENOTTY; return -1;} return r(fd,req,arg);}
ssize_t write(int fd,const void*b,size_t n){static ssize_t(*r)(int,const void*,size_t); if(!r)r=dlsym(RTLD_NEXT,"write");
  if(fd!=fake_fd || fd<0) return r(fd,b,n);
  const struct ib_uverbs_cmd_hdr*h=b; const uint64_t*body=(const void*)(h+1); void*resp=(void*)(uintptr_t)body[0];
  unsigned c=h->command & 0xff; if(c<63) counts[c]++;
  LOG("write cmd=%u (%zu bytes)\n",h->command,n);
  switch(h->command){
  case IB_USER_VERBS_CMD_GET_CONTEXT: { struct ib_uverbs_get_context_resp*g=resp; g->async_fd=eventfd(0,EFD_CLOEXEC); g->num_comp_vectors=1; break; }
  case IB_USER_VERBS_CMD_ALLOC_PD: ((struct ib_uverbs_alloc_pd_resp*)resp)->pd_handle=next_handle++; break;
  case IB_USER_VERBS_CMD_CREATE_CQ: { const struct ib_uverbs_create_cq*cc=(const void*)body; struct ib_uverbs_create_cq_resp*cr=resp; cr->cq_handle=next_handle++; cr->cqe=cc->cqe; add_q((struct mminfo*)((char*)resp+8),6,64); break; }
  case IB_USER_VERBS_CMD_CREATE_QP: { const struct ib_uverbs_create_qp*q=(const void*)body; struct ib_uverbs_create_qp_resp*qr=resp; qr->qp_handle=next_handle++; qr->qpn=0x11; qr->max_send_wr=q->max_send_wr; qr->max_recv_wr=q->max_recv_wr; qr->max_send_sge=q->max_send_sge; qr->max_recv_sge=q->max_recv_sge; qr->max_inline_data=q->max_inline_data;
      struct mminfo*mi=(struct mminfo*)((char*)resp+sizeof *qr); add_q(&mi[0],7,64); add_q(&mi[1],9,64); break; }
  case IB_USER_VERBS_CMD_MODIFY_QP: case IB_USER_VERBS_CMD_POST_SEND: case IB_USER_VERBS_CMD_DESTROY_QP: case IB_USER_VERBS_CMD_DESTROY_CQ: case IB_USER_VERBS_CMD_DEALLOC_PD: break;
  default: errno=ENOSYS; return -1; }
  return n; }
void*mmap(void*a,size_t l,int p,int f,int fd,off_t o){static void*(*r)(void*,size_t,int,int,int,off_t); if(!r)r=dlsym(RTLD_NEXT,"mmap");
  if(fd!=fake_fd || fd<0) return r(a,l,p,f,fd,o);
  for(int i=0;i<npend;i++) if(pend[i].off==(uint64_t)o){ struct rxe_queue_buf*q=r(a,l,p,MAP_SHARED|MAP_ANONYMOUS,-1,0); if(q==MAP_FAILED) return q; q->log2_elem_size=pend[i].log2; q->index_mask=pend[i].n-1; return q; }
  errno=EINVAL; return MAP_FAILED; }
__attribute__((destructor)) static void fini(void){ if(!getenv("SHIM_LOG")) return; fprintf(stderr,"[shim] cmd_fd ioctls=%lu; write cmds:",counts[63]); for(int i=0;i<63;i++) if(counts[i]) fprintf(stderr," %d:%lu",i,counts[i]); fprintf(stderr,"\n"); }

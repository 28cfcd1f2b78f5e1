/* The libfabric calls Attune makes, as real functions (most of libfabric's API is static
 * inline functions over provider ops tables, which Rust cannot call).
 *
 * libfabric is opened with dlopen on first use, never linked: attune-sys is part of the
 * interposer that `attune run` loads into every program, and a program that uses no
 * remote tier must not load (or need) the fabric library. Only the four exported entry
 * points are looked up; everything else goes through the ops tables of the objects they
 * return.
 *
 * One endpoint (RDM: reliable, unconnected) with one address vector and one completion
 * queue of tagged entries. Every operation takes a caller-owned context of
 * ATF_CTX_BYTES, alive until its completion is read (FI_CONTEXT2 mode). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>

#define ATF_VERSION FI_VERSION(1, 9)

static int (*p_getinfo)(uint32_t, const char *, const char *, uint64_t, const struct fi_info *,
                        struct fi_info **);
static void (*p_freeinfo)(struct fi_info *);
static struct fi_info *(*p_dupinfo)(const struct fi_info *);
static int (*p_fabric)(struct fi_fabric_attr *, struct fid_fabric **, void *);
static const char *(*p_strerror)(int);

struct atf_ep {
  struct fi_info *info;
  struct fid_fabric *fabric;
  struct fid_domain *domain;
  struct fid_av *av;
  struct fid_cq *cq;
  struct fid_ep *ep;
};

static void say(char *err, size_t n, const char *what, int rc) {
  if (err && n)
    snprintf(err, n, "%s: %s", what, p_strerror ? p_strerror(-rc) : "libfabric not loaded");
}

int atf_load(char *err, size_t n) {
  if (p_getinfo)
    return 0;
  /* libfabric links libpsm2 and libinfinipath, whose constructors install crash
   * handlers for SIGBUS, SIGSEGV and others (they print a backtrace and exit 1): they
   * would take the runtime's SIGBUS handler, which serves faults and ends a program
   * whose page is lost with a real SIGBUS (seen in tests/python/test_remote.py). Every
   * handler is put back as it was before the library was loaded. */
  struct sigaction saved[NSIG];
  for (int s = 1; s < NSIG; s++)
    if (sigaction(s, NULL, &saved[s]) != 0)
      saved[s].sa_handler = SIG_ERR;
  void *h = dlopen("libfabric.so.1", RTLD_NOW | RTLD_LOCAL);
  for (int s = 1; s < NSIG; s++)
    if (saved[s].sa_handler != SIG_ERR)
      sigaction(s, &saved[s], NULL);
  if (!h) {
    if (err && n)
      snprintf(err, n, "cannot load libfabric.so.1 (install libfabric1): %s", dlerror());
    return -ENOENT;
  }
  p_freeinfo = dlsym(h, "fi_freeinfo");
  p_dupinfo = dlsym(h, "fi_dupinfo");
  p_fabric = dlsym(h, "fi_fabric");
  p_strerror = dlsym(h, "fi_strerror");
  void *g = dlsym(h, "fi_getinfo");
  if (!g || !p_freeinfo || !p_dupinfo || !p_fabric || !p_strerror) {
    if (err && n)
      snprintf(err, n, "libfabric.so.1 lacks fi_getinfo/fi_fabric");
    return -ENOSYS;
  }
  __atomic_store_n(&p_getinfo, g, __ATOMIC_RELEASE);
  return 0;
}

const char *atf_strerror(int rc) { return p_strerror ? p_strerror(rc < 0 ? -rc : rc) : "?"; }

void atf_close(struct atf_ep *e) {
  if (!e)
    return;
  if (e->ep)
    fi_close(&e->ep->fid);
  if (e->av)
    fi_close(&e->av->fid);
  if (e->cq)
    fi_close(&e->cq->fid);
  if (e->domain)
    fi_close(&e->domain->fid);
  if (e->fabric)
    fi_close(&e->fabric->fid);
  if (e->info)
    p_freeinfo(e->info);
  free(e);
}

static struct fi_info *hints_for(const char *prov) {
  struct fi_info *h = p_dupinfo(NULL);
  if (!h)
    return NULL;
  h->caps = FI_MSG | FI_TAGGED;
  h->mode = FI_CONTEXT | FI_CONTEXT2;
  h->ep_attr->type = FI_EP_RDM;
  h->domain_attr->threading = FI_THREAD_DOMAIN;
  h->domain_attr->mr_mode = 0;
  h->tx_attr->msg_order = FI_ORDER_SAS;
  h->rx_attr->msg_order = FI_ORDER_SAS;
  if (prov && *prov)
    h->fabric_attr->prov_name = strdup(prov);
  return h;
}

static int getinfo_for(const char *prov, const char *node, const char *service, int listen,
                       struct fi_info **info) {
  struct fi_info *h = hints_for(prov);
  if (!h)
    return -ENOMEM;
  int rc = listen ? p_getinfo(ATF_VERSION, node, service, FI_SOURCE, h, info)
                  : p_getinfo(ATF_VERSION, NULL, NULL, 0, h, info);
  p_freeinfo(h);
  return rc;
}

/* Opens an endpoint. `node`/`service` given with `listen` set: bound there (a server);
 * otherwise any local address (a client).
 *
 * "tcp" means reliable messages over TCP sockets. libfabric 1.17's tcp provider has
 * connected endpoints only, layered under ofi_rxm for RDM, and that layer's connection
 * handling broke live peers' connections under load (docs/design/remote.md, "TCP without
 * ofi_rxm"); its `net` provider is the native RDM-over-TCP implementation that became
 * `tcp` in 1.18. So "tcp" asks for `net` first, and takes `tcp` (ofi_rxm on 1.17, native
 * from 1.18) where there is no `net`. "tcp;ofi_rxm" names the layered one explicitly. */
int atf_open(const char *prov, const char *node, const char *service, int listen,
             struct atf_ep **out, char *err, size_t n) {
  int rc = atf_load(err, n);
  if (rc)
    return rc;
  struct atf_ep *e = calloc(1, sizeof *e);
  if (!e)
    return -ENOMEM;
  rc = -FI_ENODATA;
  if (prov && strcmp(prov, "tcp") == 0)
    rc = getinfo_for("net", node, service, listen, &e->info);
  if (rc)
    rc = getinfo_for(prov, node, service, listen, &e->info);
  if (rc) {
    say(err, n, "fi_getinfo", rc);
    free(e);
    return rc;
  }
  struct fi_cq_attr cqa = {.format = FI_CQ_FORMAT_TAGGED, .wait_obj = FI_WAIT_UNSPEC, .size = 256};
  struct fi_av_attr ava = {.type = FI_AV_MAP};
  if ((rc = p_fabric(e->info->fabric_attr, &e->fabric, NULL))) {
    say(err, n, "fi_fabric", rc);
  } else if ((rc = fi_domain(e->fabric, e->info, &e->domain, NULL))) {
    say(err, n, "fi_domain", rc);
  } else if ((rc = fi_cq_open(e->domain, &cqa, &e->cq, NULL))) {
    say(err, n, "fi_cq_open", rc);
  } else if ((rc = fi_av_open(e->domain, &ava, &e->av, NULL))) {
    say(err, n, "fi_av_open", rc);
  } else if ((rc = fi_endpoint(e->domain, e->info, &e->ep, NULL))) {
    say(err, n, "fi_endpoint", rc);
  } else if ((rc = fi_ep_bind(e->ep, &e->cq->fid, FI_TRANSMIT | FI_RECV))) {
    say(err, n, "fi_ep_bind(cq)", rc);
  } else if ((rc = fi_ep_bind(e->ep, &e->av->fid, 0))) {
    say(err, n, "fi_ep_bind(av)", rc);
  } else if ((rc = fi_enable(e->ep))) {
    say(err, n, "fi_enable", rc);
  }
  if (rc) {
    atf_close(e);
    return rc;
  }
  *out = e;
  return 0;
}

/* The endpoint's own address, as the provider names it (for a peer's address vector). */
int atf_name(struct atf_ep *e, void *buf, size_t *len) { return fi_getname(&e->ep->fid, buf, len); }

/* Adds a peer by the raw address it sent (atf_name). */
int atf_insert(struct atf_ep *e, const void *addr, uint64_t *fi) {
  fi_addr_t a = FI_ADDR_UNSPEC;
  int rc = fi_av_insert(e->av, addr, 1, &a, 0, NULL);
  if (rc != 1)
    return rc < 0 ? rc : -FI_EINVAL;
  *fi = a;
  return 0;
}

/* Adds a peer by host and port (a server): the provider resolves the name. */
int atf_resolve(struct atf_ep *e, const char *node, const char *service, uint64_t *fi,
                char *err, size_t n) {
  /* The provider the endpoint was opened with (`net` for "tcp" on libfabric 1.17). */
  struct fi_info *h = hints_for(e->info->fabric_attr->prov_name), *info = NULL;
  if (!h)
    return -ENOMEM;
  int rc = p_getinfo(ATF_VERSION, node, service, 0, h, &info);
  p_freeinfo(h);
  if (rc) {
    say(err, n, "fi_getinfo", rc);
    return rc;
  }
  if (!info->dest_addr) {
    p_freeinfo(info);
    if (err && n)
      snprintf(err, n, "the provider gave no address for %s:%s", node, service);
    return -FI_EINVAL;
  }
  rc = atf_insert(e, info->dest_addr, fi);
  if (rc)
    say(err, n, "fi_av_insert", rc);
  p_freeinfo(info);
  return rc;
}

int atf_remove(struct atf_ep *e, uint64_t fi) { return fi_av_remove(e->av, &fi, 1, 0); }

/* Sends `iov` to `dest`, tagged when `tagged` (a reply) or not (a request). -FI_EAGAIN:
 * read completions and try again. */
long atf_sendv(struct atf_ep *e, const struct iovec *iov, size_t cnt, uint64_t dest, uint64_t tag,
               int tagged, void *ctx) {
  if (tagged)
    return fi_tsendv(e->ep, iov, NULL, cnt, dest, tag, ctx);
  return fi_sendv(e->ep, iov, NULL, cnt, dest, ctx);
}

/* Posts a receive: tagged with `tag` (a reply) or untagged from anyone (a request). */
long atf_recvv(struct atf_ep *e, const struct iovec *iov, size_t cnt, uint64_t tag, int tagged,
               void *ctx) {
  if (tagged)
    return fi_trecvv(e->ep, iov, NULL, cnt, FI_ADDR_UNSPEC, tag, 0, ctx);
  return fi_recvv(e->ep, iov, NULL, cnt, FI_ADDR_UNSPEC, ctx);
}

/* Cancels a posted operation (its completion then reports FI_ECANCELED). */
int atf_cancel(struct atf_ep *e, void *ctx) { return (int)fi_cancel(&e->ep->fid, ctx); }

/* Reads one completion, waiting up to `timeout_ms` (0: do not wait). Returns 1 with the
 * operation's context, its length and 0 or a positive error number in `status`; 0 when
 * none came; a negative libfabric error. Reading drives the provider's progress. */
int atf_poll(struct atf_ep *e, int timeout_ms, void **ctx, size_t *len, int *status) {
  struct fi_cq_tagged_entry c;
  ssize_t rc = timeout_ms > 0 ? fi_cq_sread(e->cq, &c, 1, NULL, timeout_ms) : fi_cq_read(e->cq, &c, 1);
  /* The rxm provider's blocking read reports its wait set's own errors (-FI_ENOENT when
   * a peer's connection went away while the queue slept, seen when a client exits with
   * replies in flight): they say nothing about the queue, which is read again. */
  if (timeout_ms > 0 && rc < 0 && rc != -FI_EAGAIN && rc != -FI_EAVAIL && rc != -FI_ETIMEDOUT)
    rc = fi_cq_read(e->cq, &c, 1);
  if (rc == 1) {
    *ctx = c.op_context;
    *len = c.len;
    *status = 0;
    return 1;
  }
  if (rc == -FI_EAGAIN || rc == -FI_ETIMEDOUT || rc == -FI_EINTR)
    return 0;
  if (rc == -FI_EAVAIL) {
    struct fi_cq_err_entry ee;
    memset(&ee, 0, sizeof ee);
    if (fi_cq_readerr(e->cq, &ee, 0) == 1) {
      *ctx = ee.op_context;
      *len = ee.len;
      *status = ee.err ? ee.err : FI_EIO;
      return 1;
    }
    return 0;
  }
  return (int)rc;
}

/* The provider chosen (for logs). */
const char *atf_provider(struct atf_ep *e) { return e->info->fabric_attr->prov_name; }

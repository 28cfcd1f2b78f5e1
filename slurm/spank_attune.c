/*
 * spank_attune.so: Slurm jobs ask for tiered memory at submission.
 *
 *   sbatch --mem=4G --tm-flags=CAP --tm-far=file job.sh      (or #SBATCH --tm-flags=CAP)
 *   srun --tm-flags=LAT,BW --tm-dram=2G ./solver
 *
 * A job that gives any --tm-* option has each task started with Attune's interposer
 * (LD_PRELOAD, as `attune run` does) and its settings in the task's environment; a job that
 * gives none is not touched (the plugin then costs one option lookup per task).
 *
 * Rules (docs/design/slurm.md):
 * - Values are checked where the user typed them (srun, sbatch, salloc), with the same
 *   grammar and wording as the runtime (`attune run --flags`, ATTUNE_DRAM): a bad value
 *   makes the command exit with the plugin's message before anything is queued.
 * - The DRAM budget of a task defaults to the job's memory limit on the node (the tightest
 *   limit of its memory cgroup, else Slurm's allocation) less a headroom for what the
 *   program keeps outside Attune, divided among the node's tasks of the step. A percentage
 *   in --tm-dram is of that limit. A budget that cannot fit under the limit fails the task
 *   with a message instead of being OOM-killed later.
 * - The far tiers default to memory outside the job: the node's pool in attuned when its
 *   socket exists, then a file tier (O_DIRECT) in the job's TMPDIR. The in-process
 *   `memory` tier only when asked for (--tm-far=memory): it is charged to the job.
 * - The workflow is the job: `slurm-<jobid>`, or `slurm-<arrayjob>_<task>` for an array task.
 *
 * - Each managed process writes its statistics into a private directory of the job
 *   (/tmp/attune-slurm-UID/JOBID, mode 0700, made as the user); at the end of each step the
 *   job's one-line summary (`attune report --oneline`, run as the user) becomes the job's
 *   comment, where `scontrol show job` and sacct (AccountingStoreFlags=job_comment) show
 *   it. The job's epilog removes the directory.
 *
 * - Where no service manager runs attuned, `attuned=PATH` in plugstack.conf makes the
 *   first job's prolog on a node start it (detached, log in SOCKET.log), under a lock so
 *   that concurrent prologs start one daemon.
 *
 * Plugin arguments (plugstack.conf): preload=PATH (libattune_preload.so), attune=PATH (the
 * attune command), socket=PATH (attuned's socket), headroom=PERCENT (of the limit, at least
 * 32 MiB; default 10), attuned=PATH and attuned_config=FILE (start the daemon if needed),
 * userfaultfd=device (hand each task /dev/userfaultfd; default user: what the user opens).
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <dirent.h>
#include <grp.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <slurm/spank.h>

SPANK_PLUGIN(attune, 1);

#ifndef ATTUNE_PRELOAD_DEFAULT
#define ATTUNE_PRELOAD_DEFAULT "/usr/local/lib/libattune_preload.so"
#endif
#ifndef ATTUNE_CLI_DEFAULT
#define ATTUNE_CLI_DEFAULT "/usr/local/bin/attune"
#endif
#define SOCKET_DEFAULT "/run/attune/attuned.sock"
#define MIB (1024ULL * 1024ULL)
/* What a task keeps outside Attune (program, libraries, small allocations, the runtime's
 * own tables) needs room under the limit: 10% of it, at least this much. */
#define HEADROOM_FLOOR (32 * MIB)

enum { OPT_FLAGS = 1, OPT_DRAM, OPT_FAR, OPT_WORKFLOW, OPT_CONFIG };

static char *opt_flags, *opt_dram, *opt_far, *opt_workflow, *opt_config;
static char preload_path[PATH_MAX] = ATTUNE_PRELOAD_DEFAULT;
static char socket_path[PATH_MAX] = SOCKET_DEFAULT;
static char attune_cli[PATH_MAX] = ATTUNE_CLI_DEFAULT;
static char attuned_path[PATH_MAX], attuned_config[PATH_MAX];
/* The job's statistics directory, once user_init has made it (inherited by the tasks). */
static char report_dir[PATH_MAX];
static unsigned headroom_pct = 10;
/* userfaultfd=device: each task gets a descriptor of /dev/userfaultfd, opened as root
 * before the task drops its privileges, so that kernel accesses to its non-resident pages
 * are served where vm.unprivileged_userfaultfd=0 (docs/design/run.md, "Fault delivery"). */
static int hand_userfaultfd;

/* ---- values, checked with the runtime's grammar --------------------------------------- */

/* Flags: LAT, BW, CAP, SHL, auto or none, separated by ',', '|' or '+', any case
 * (attune_policy::Flags::parse). */
int attune_check_flags(const char *s, char *why, size_t n)
{
    char buf[128];
    if (strlen(s) >= sizeof buf) {
        snprintf(why, n, "at most %zu characters", sizeof buf - 1);
        return -1;
    }
    strcpy(buf, s);
    char *save = NULL;
    for (char *p = strtok_r(buf, ",|+", &save); p; p = strtok_r(NULL, ",|+", &save)) {
        while (*p == ' ' || *p == '\t')
            p++;
        char *e = p + strlen(p);
        while (e > p && (e[-1] == ' ' || e[-1] == '\t'))
            *--e = 0;
        if (!*p)
            continue;
        static const char *known[] = {"LAT", "BW", "CAP", "SHL", "AUTO", "NONE"};
        int ok = 0;
        for (size_t i = 0; i < sizeof known / sizeof *known; i++)
            ok |= strcasecmp(p, known[i]) == 0;
        if (!ok) {
            char up[128];
            size_t i;
            for (i = 0; p[i] && i + 1 < sizeof up; i++)
                up[i] = (p[i] >= 'a' && p[i] <= 'z') ? p[i] - 32 : p[i];
            up[i] = 0;
            snprintf(why, n, "unknown flag '%s' (expected LAT, BW, CAP, SHL or auto)", up);
            return -1;
        }
    }
    return 0;
}

/* A size with an optional K/M/G/T suffix (powers of 1024, optional "iB"/"B"), as
 * attune::size::parse_size; or, when `pct` is given, a percentage (0-100%]. */
int attune_parse_size(const char *s, uint64_t *bytes, double *pct, char *why, size_t n)
{
    char buf[64];
    const char *t = s;
    while (*t == ' ')
        t++;
    size_t len = strlen(t);
    while (len && t[len - 1] == ' ')
        len--;
    if (len == 0 || len >= sizeof buf) {
        snprintf(why, n, len ? "'%s' is too long" : "empty size", s);
        return -1;
    }
    memcpy(buf, t, len);
    buf[len] = 0;
    if (buf[len - 1] == '%') {
        if (!pct) {
            snprintf(why, n, "'%s' is not a size (examples: 4096, 64K, 2M, 1.5G)", s);
            return -1;
        }
        buf[len - 1] = 0;
        char *end;
        errno = 0;
        double v = strtod(buf, &end);
        if (end == buf || *end || errno || !(v > 0.0 && v <= 100.0)) {
            snprintf(why, n, "'%s': a percentage must be more than 0%% and at most 100%%", s);
            return -1;
        }
        *pct = v;
        *bytes = 0;
        return 0;
    }
    for (size_t i = 0; i < len; i++)
        buf[i] = (buf[i] >= 'a' && buf[i] <= 'z') ? buf[i] - 32 : buf[i];
    if (len >= 2 && !strcmp(buf + len - 2, "IB"))
        buf[len -= 2] = 0;
    if (len >= 1 && buf[len - 1] == 'B')
        buf[--len] = 0;
    double mult = 1;
    if (len >= 1 && strchr("KMGT", buf[len - 1])) {
        mult = (double)(1ULL << (10 * (1 + (strchr("KMGT", buf[len - 1]) - "KMGT"))));
        buf[--len] = 0;
    }
    char *end;
    errno = 0;
    double v = len ? strtod(buf, &end) : 0;
    if (!len || end == buf || *end || errno || !isfinite(v) || v < 0) {
        snprintf(why, n, "'%s' is not a size (examples: 4096, 64K, 2M, 1.5G)", s);
        return -1;
    }
    if (v * mult > (double)(UINT64_MAX / 2)) {
        snprintf(why, n, "'%s' is too large", s);
        return -1;
    }
    *bytes = (uint64_t)(v * mult);
    if (pct)
        *pct = 0;
    return 0;
}

/* A DRAM budget: a size of at least 1 MiB (the runtime's floor), or a percentage. */
int attune_check_dram(const char *s, char *why, size_t n)
{
    uint64_t b;
    double p;
    if (attune_parse_size(s, &b, &p, why, n))
        return -1;
    if (p == 0 && b == 0) {
        snprintf(why, n, "the budget must be more than 0 bytes");
        return -1;
    }
    if (p == 0 && b < MIB) {
        snprintf(why, n, "%llu bytes is too small (at least 1.0 MiB)", (unsigned long long)b);
        return -1;
    }
    return 0;
}

/* Far tiers: kinds from pool, file and memory, comma-separated, each once (ATTUNE_FAR; an
 * empty item is refused, as the runtime refuses it). */
int attune_check_far(const char *s, char *why, size_t n)
{
    static const char *kinds[] = {"pool", "file", "memory"};
    unsigned seen = 0;
    const char *p = s;
    for (;;) {
        size_t len = strcspn(p, ",");
        unsigned k = 0;
        while (k < 3 && (strlen(kinds[k]) != len || strncmp(p, kinds[k], len)))
            k++;
        if (k == 3) {
            snprintf(why, n, "'%.*s' is not a far tier kind (expected pool, file or memory)",
                     (int)(len < 64 ? len : 64), p);
            return -1;
        }
        if (seen & (1u << k)) {
            snprintf(why, n, "'%s' is named twice", kinds[k]);
            return -1;
        }
        seen |= 1u << k;
        if (!p[len])
            return 0;
        p += len + 1;
    }
}

/* Workflow: 1-128 printable characters, no spaces (the daemon's rule). */
int attune_check_workflow(const char *s, char *why, size_t n)
{
    size_t len = strlen(s);
    int ok = len > 0 && len <= 128;
    for (size_t i = 0; ok && i < len; i++)
        ok = s[i] > ' ' && s[i] < 127;
    if (!ok) {
        snprintf(why, n, "a workflow name is 1-128 printable characters, no spaces");
        return -1;
    }
    return 0;
}

/* ---- option callbacks (srun, sbatch, salloc, and again in slurmstepd) ------------------ */

static int keep(char **slot, const char *opt, const char *arg, int bad, const char *why)
{
    if (bad) {
        slurm_error("attune: --%s=%s: %s", opt, arg, why);
        return -1;
    }
    free(*slot);
    *slot = strdup(arg);
    return *slot ? 0 : -1;
}

static int on_option(int val, const char *arg, int remote)
{
    char why[256] = "";
    (void)remote;
    if (!arg)
        arg = "";
    switch (val) {
    case OPT_FLAGS:
        return keep(&opt_flags, "tm-flags", arg, attune_check_flags(arg, why, sizeof why), why);
    case OPT_DRAM:
        return keep(&opt_dram, "tm-dram", arg, attune_check_dram(arg, why, sizeof why), why);
    case OPT_FAR:
        return keep(&opt_far, "tm-far", arg, attune_check_far(arg, why, sizeof why), why);
    case OPT_WORKFLOW:
        return keep(&opt_workflow, "tm-workflow", arg,
                    attune_check_workflow(arg, why, sizeof why), why);
    case OPT_CONFIG: {
        /* Where the user typed it, a relative path is made absolute and must be readable:
         * the tasks run elsewhere (another directory, another node of a shared file system). */
        if (!remote) {
            char abs[PATH_MAX];
            if (!realpath(arg, abs) || access(abs, R_OK) != 0) {
                snprintf(why, sizeof why, "cannot read the configuration file: %s",
                         strerror(errno));
                return keep(&opt_config, "tm-config", arg, 1, why);
            }
            return keep(&opt_config, "tm-config", abs, 0, "");
        }
        return keep(&opt_config, "tm-config", arg, 0, "");
    }
    }
    return -1;
}

static struct spank_option options[] = {
    {"tm-flags", "FLAGS",
     "Attune: tiered memory for this job; flags of its managed memory: LAT, BW, CAP, SHL "
     "(comma-separated) or auto",
     1, OPT_FLAGS, on_option},
    {"tm-dram", "SIZE|PERCENT",
     "Attune: DRAM budget per task (512M, 4G), or a percentage of the job's memory on the "
     "node; default: the job's limit less a headroom, divided among its tasks",
     1, OPT_DRAM, on_option},
    {"tm-far", "KINDS",
     "Attune: far tiers: pool (attuned's node pool), file (local scratch), memory "
     "(in the job's own memory, for experiments); default pool,file",
     1, OPT_FAR, on_option},
    {"tm-workflow", "NAME",
     "Attune: workflow name the node daemon grants DRAM by (default slurm-JOBID)", 1,
     OPT_WORKFLOW, on_option},
    {"tm-config", "FILE",
     "Attune: configuration file (TOML) of the job's tasks, e.g. for memory servers", 1,
     OPT_CONFIG, on_option},
    SPANK_OPTIONS_TABLE_END};

/* ---- plug-in life cycle ------------------------------------------------------------------ */

static int plugin_args(int ac, char **av)
{
    for (int i = 0; i < ac; i++) {
        const char *a = av[i];
        if (!strncmp(a, "preload=", 8) && strlen(a + 8) < sizeof preload_path) {
            strcpy(preload_path, a + 8);
        } else if (!strncmp(a, "attuned=", 8) && strlen(a + 8) < sizeof attuned_path) {
            strcpy(attuned_path, a + 8);
        } else if (!strncmp(a, "attuned_config=", 15) && strlen(a + 15) < sizeof attuned_config) {
            strcpy(attuned_config, a + 15);
        } else if (!strncmp(a, "attune=", 7) && strlen(a + 7) < sizeof attune_cli) {
            strcpy(attune_cli, a + 7);
        } else if (!strncmp(a, "socket=", 7) && strlen(a + 7) < sizeof socket_path) {
            strcpy(socket_path, a + 7);
        } else if (!strcmp(a, "userfaultfd=device")) {
            hand_userfaultfd = 1;
        } else if (!strcmp(a, "userfaultfd=user")) {
            hand_userfaultfd = 0;
        } else if (!strncmp(a, "headroom=", 9)) {
            char *end;
            long v = strtol(a + 9, &end, 10);
            if (end == a + 9 || (*end && strcmp(end, "%")) || v < 0 || v > 90) {
                slurm_error("attune: plugstack argument %s: a percentage from 0 to 90", a);
                return -1;
            }
            headroom_pct = (unsigned)v;
        } else {
            slurm_error("attune: unknown plugstack argument '%s' (preload=, attune=, socket=, "
                        "headroom=, attuned=, attuned_config=, userfaultfd=device|user)",
                        a);
            return -1;
        }
    }
    return 0;
}

int slurm_spank_init(spank_t sp, int ac, char **av)
{
    spank_context_t ctx = spank_context();
    if (ctx != S_CTX_LOCAL && ctx != S_CTX_REMOTE && ctx != S_CTX_ALLOCATOR)
        return 0;
    /* Options must be registered in every context where they are used, allocator included
     * (an option only in the static table is unknown to sbatch and salloc). */
    for (struct spank_option *o = options; o->name; o++)
        if (spank_option_register(sp, o) != ESPANK_SUCCESS) {
            slurm_error("attune: cannot register --%s", o->name);
            return -1;
        }
    return ctx == S_CTX_REMOTE ? plugin_args(ac, av) : 0;
}

/* The tightest memory limit of this process's cgroup and its ancestors (v1 or v2), or 0. */
static uint64_t cgroup_limit(void)
{
    FILE *f = fopen("/proc/self/cgroup", "r");
    if (!f)
        return 0;
    char line[4096], path[PATH_MAX] = "";
    const char *base = NULL, *file = NULL;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        char *c1 = strchr(line, ':');
        char *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2)
            continue;
        *c2 = 0;
        const char *ctrls = c1 + 1;
        /* v1: a hierarchy whose controllers include memory; v2: the unified one. */
        int v1 = 0;
        char cl[256];
        snprintf(cl, sizeof cl, ",%s,", ctrls);
        v1 = strstr(cl, ",memory,") != NULL;
        if (v1) {
            base = "/sys/fs/cgroup/memory";
            file = "memory.limit_in_bytes";
            snprintf(path, sizeof path, "%s", c2 + 1);
            break;
        }
        if (!*ctrls && !base) {
            base = "/sys/fs/cgroup";
            file = "memory.max";
            snprintf(path, sizeof path, "%s", c2 + 1);
        }
    }
    fclose(f);
    if (!base)
        return 0;
    uint64_t best = 0;
    for (;;) {
        char p[PATH_MAX + 128];
        snprintf(p, sizeof p, "%s%s/%s", base, path, file);
        FILE *m = fopen(p, "r");
        if (m) {
            char v[64] = "";
            if (fgets(v, sizeof v, m) && strncmp(v, "max", 3)) {
                uint64_t x = strtoull(v, NULL, 10);
                /* v1 writes "unlimited" as a page-rounded LONG_MAX. */
                if (x && x < (1ULL << 62) && (!best || x < best))
                    best = x;
            }
            fclose(m);
        }
        char *slash = strrchr(path, '/');
        if (!slash || !path[0] || !strcmp(path, "/"))
            break;
        *slash = 0;
    }
    return best;
}

/* Whether this user gets only user-mode userfaultfd (vm.unprivileged_userfaultfd=0 and no
 * access to /dev/userfaultfd): the kernel then cannot fault managed pages in for a peer. */
static int uffd_user_mode_only(void)
{
    long fd = syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
    if (fd >= 0) {
        close((int)fd);
        return 0;
    }
    int d = open("/dev/userfaultfd", O_RDWR | O_CLOEXEC);
    if (d >= 0) {
        close(d);
        return 0;
    }
    return 1;
}

static int active(void)
{
    return opt_flags || opt_dram || opt_far || opt_workflow || opt_config;
}

static int job_ids(spank_t sp, uint32_t *job, uid_t *uid)
{
    return spank_get_item(sp, S_JOB_ID, job) == ESPANK_SUCCESS &&
           spank_get_item(sp, S_JOB_UID, uid) == ESPANK_SUCCESS;
}

/* For a job allocated several nodes (the job's, not the step's: a batch step runs on one):
 * this node's name, made safe for a path, and 1; 0 for a one-node job. */
static int job_node(spank_t sp, char *node, size_t n)
{
    char nodes[16] = "";
    if (spank_getenv(sp, "SLURM_JOB_NUM_NODES", nodes, sizeof nodes) != ESPANK_SUCCESS ||
        atoi(nodes) <= 1)
        return 0;
    /* slurmd's own environment names its node (slurmstepd inherits it); the job's may
     * hold the name of the node a step was started from. */
    const char *self = getenv("SLURMD_NODENAME");
    if (self && *self)
        snprintf(node, n, "%s", self);
    else if (gethostname(node, n) != 0 || !*node)
        snprintf(node, n, "node");
    node[n - 1] = 0;
    for (char *c = node; *c; c++)
        if (!(*c >= 'a' && *c <= 'z') && !(*c >= 'A' && *c <= 'Z') && !(*c >= '0' && *c <= '9') &&
            *c != '-' && *c != '_')
            *c = '_';
    return 1;
}

/* A directory `path` this user owns, private to it (made if missing): 0 or -1. */
static int private_dir(const char *path, uid_t uid)
{
    if (mkdir(path, 0700) != 0 && errno != EEXIST)
        return -1;
    struct stat st;
    if (lstat(path, &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != uid ||
        (st.st_mode & 077)) {
        errno = EPERM;
        return -1;
    }
    return 0;
}

/* In slurmstepd as the job's user, before the tasks start: the job's statistics directory.
 * A base directory someone else made (or opened to others) is not used: no report then. */
int slurm_spank_user_init(spank_t sp, int ac, char **av)
{
    (void)ac;
    (void)av;
    uint32_t job;
    uid_t uid;
    if (!active() || !job_ids(sp, &job, &uid))
        return 0;
    char base[64], dir[96];
    snprintf(base, sizeof base, "/tmp/attune-slurm-%u", (unsigned)uid);
    snprintf(dir, sizeof dir, "%s/%u", base, job);
    /* A job on several nodes: one directory per node below the job's, so that each node's
     * summary is its own also where /tmp is shared (the epilog empties both levels). */
    char node[64];
    if (job_node(sp, node, sizeof node) && private_dir(dir, uid) == 0)
        snprintf(dir + strlen(dir), sizeof dir - strlen(dir), "/%s", node);
    if (private_dir(base, uid) || private_dir(dir, uid)) {
        slurm_info("attune: %s cannot be this job's private report directory (%s): no summary",
                   dir, strerror(errno));
        return 0;
    }
    snprintf(report_dir, sizeof report_dir, "%s", dir);
    return 0;
}

/* Runs argv as `uid`/`gid` (or as we are, when uid is -1) and keeps the first line of its
 * output in `line`; gives it at most `secs` seconds. 0 when it exited with status 0. */
static int run_for_line(char *const argv[], uid_t uid, gid_t gid, int with_stderr, char *line,
                        size_t n, int secs)
{
    int fds[2];
    if (pipe(fds) != 0)
        return -1;
    pid_t pid = fork();
    if (pid < 0) {
        close(fds[0]);
        close(fds[1]);
        return -1;
    }
    if (pid == 0) {
        int null = open("/dev/null", O_RDWR);
        if (null >= 0)
            dup2(null, 0);
        dup2(fds[1], 1);
        dup2(with_stderr ? fds[1] : null, 2);
        close(fds[0]);
        close(fds[1]);
        if (uid != (uid_t)-1 &&
            (setgroups(0, NULL) != 0 || setgid(gid) != 0 || setuid(uid) != 0))
            _exit(126);
        execv(argv[0], argv);
        _exit(127);
    }
    close(fds[1]);
    size_t got = 0;
    time_t end = time(NULL) + secs;
    int st = -1;
    fcntl(fds[0], F_SETFL, O_NONBLOCK);
    for (;;) {
        if (n > 1 && got < n - 1) {
            ssize_t r = read(fds[0], line + got, n - 1 - got);
            if (r > 0)
                got += (size_t)r;
        }
        pid_t w = waitpid(pid, &st, WNOHANG);
        if (w == pid)
            break;
        if (time(NULL) > end) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            st = -1;
            break;
        }
        usleep(10000);
    }
    if (n > 1 && got < n - 1) {
        ssize_t r = read(fds[0], line + got, n - 1 - got);
        if (r > 0)
            got += (size_t)r;
    }
    close(fds[0]);
    if (n)
        line[got] = 0;
    line[strcspn(line, "\n")] = 0;
    return (st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0) ? 0 : -1;
}

/* Most bytes of a job's comment the plugin writes (each node's part is about 130; parts
 * of 16 nodes are kept). */
#define COMMENT_MAX 8192

/* `comment` with this node's part `node: summary` put in, the parts sorted by node:
 * "attune: n1: ...; n2: ...". Parts of other nodes are kept as they are. */
static void merge_comment(char *comment, size_t n, const char *node, const char *summary)
{
    char parts[16][640];
    int np = 0;
    if (!strncmp(comment, "attune: ", 8)) {
        char *save = NULL;
        for (char *p = strtok_r(comment + 8, ";", &save); p && np < 16;
             p = strtok_r(NULL, ";", &save)) {
            while (*p == ' ')
                p++;
            size_t k = strlen(node);
            if (!*p || (!strncmp(p, node, k) && p[k] == ':'))
                continue;
            snprintf(parts[np++], sizeof parts[0], "%s", p);
        }
    }
    if (np < 16)
        snprintf(parts[np++], sizeof parts[0], "%.63s: %.512s", node, summary);
    for (int i = 1; i < np; i++)
        for (int j = i; j > 0 && strcmp(parts[j - 1], parts[j]) > 0; j--) {
            char t[sizeof parts[0]];
            memcpy(t, parts[j], sizeof t);
            memcpy(parts[j], parts[j - 1], sizeof t);
            memcpy(parts[j - 1], t, sizeof t);
        }
    size_t at = (size_t)snprintf(comment, n, "attune: ");
    for (int i = 0; i < np && at < n; i++)
        at += (size_t)snprintf(comment + at, n - at, "%s%s", i ? "; " : "", parts[i]);
}

/* The job's comment becomes its summary: the line itself on a one-node job; on a job of
 * several nodes each node's slurmstepd puts its own part in (`node` set), reading the
 * comment first. Two nodes may write at once, so each reads its part back and tries again
 * (at most 8 times, after a random pause) until the comment holds it. */
static void set_comment(uint32_t job, const char *node, const char *summary)
{
    char id[32], cur[COMMENT_MAX], arg[COMMENT_MAX + 16], out[256];
    snprintf(id, sizeof id, "%u", job);
    for (int attempt = 0; attempt < 8; attempt++) {
        cur[0] = 0;
        if (node) {
            char *show[] = {"/usr/bin/squeue", "-h", "-j", id, "-o", "%k", NULL};
            if (run_for_line(show, (uid_t)-1, 0, 0, cur, sizeof cur, 10) != 0 ||
                !strcmp(cur, "(null)"))
                cur[0] = 0;
            merge_comment(cur, sizeof cur, node, summary);
        } else {
            snprintf(cur, sizeof cur, "attune: %s", summary);
        }
        char jid[48];
        snprintf(jid, sizeof jid, "JobId=%u", job);
        snprintf(arg, sizeof arg, "Comment=%s", cur);
        char *update[] = {"/usr/bin/scontrol", "update", jid, arg, NULL};
        if (run_for_line(update, (uid_t)-1, 0, 1, out, sizeof out, 10) != 0) {
            slurm_info("attune: job %u: scontrol could not set the comment: %s", job, out);
            return;
        }
        if (!node)
            return;
        srand((unsigned)getpid() ^ (unsigned)time(NULL) ^ (unsigned)attempt);
        struct timespec pause = {0, (50 + rand() % 200) * 1000000L};
        nanosleep(&pause, NULL);
        char *show[] = {"/usr/bin/squeue", "-h", "-j", id, "-o", "%k", NULL};
        char mine[640];
        snprintf(mine, sizeof mine, "%.63s: %.512s", node, summary);
        if (run_for_line(show, (uid_t)-1, 0, 0, cur, sizeof cur, 10) != 0 || strstr(cur, mine))
            return;
    }
    slurm_info("attune: job %u: node %s's summary did not stay in the comment", job, node);
}

/* In slurmstepd (root) when the step's last task on the node has ended (the job is still
 * running then; at the step's exit an srun-only job has already finished and its comment
 * cannot change): the job's summary so far becomes its comment. The summary is made by the
 * user's own `attune report`, on the user's files. */
int slurm_spank_task_exit(spank_t sp, int ac, char **av)
{
    (void)ac;
    (void)av;
    static uint32_t exited;
    uint32_t tasks = 1;
    if (spank_context() != S_CTX_REMOTE || !active() || !*report_dir)
        return 0;
    if (spank_get_item(sp, S_JOB_LOCAL_TASK_COUNT, &tasks) != ESPANK_SUCCESS || !tasks)
        tasks = 1;
    if (++exited < tasks)
        return 0;
    uint32_t job;
    uid_t uid;
    gid_t gid;
    if (!job_ids(sp, &job, &uid) || spank_get_item(sp, S_JOB_GID, &gid) != ESPANK_SUCCESS)
        return 0;
    char line[512] = "", node[64], dir[PATH_MAX + 80];
    int multi = job_node(sp, node, sizeof node);
    snprintf(dir, sizeof dir, "%s", report_dir);
    /* A step that saw one node when it began (a batch step) reports this node's part of a
     * job on several nodes, as the job's other steps on this node wrote it. */
    size_t k = strlen(report_dir), m = strlen(node);
    if (multi && !(k > m && report_dir[k - m - 1] == '/' && !strcmp(report_dir + k - m, node)))
        snprintf(dir, sizeof dir, "%s/%s", report_dir, node);
    char *report[] = {attune_cli, "report", "--oneline", dir, NULL};
    if (run_for_line(report, uid, gid, 0, line, sizeof line, 10) != 0 ||
        strncmp(line, "attune:", 7)) {
        slurm_info("attune: job %u: no summary (%s report failed)", job, attune_cli);
        return 0;
    }
    for (char *c = line; *c; c++)
        if (*c < ' ' || *c > '~')
            *c = '?';
    slurm_info("attune: job %u: %s", job, line);
    set_comment(job, multi ? node : NULL, line + strlen("attune: "));
    return 0;
}

/* Whether a daemon answers on the socket. */
static int daemon_answers(void)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    if (strlen(socket_path) >= sizeof a.sun_path)
        return 0;
    strcpy(a.sun_path, socket_path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return 0;
    int ok = connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
    close(fd);
    return ok;
}

/* In slurmd (root) when a job starts on the node: attuned, if the site asked the plugin to
 * run it (attuned=) and none answers. A daemon that does not come up is logged; the job
 * runs without one (each task on its own budget). */
int slurm_spank_job_prolog(spank_t sp, int ac, char **av)
{
    (void)sp;
    /* The prolog's process is given the plugstack arguments here, not in init. */
    if (plugin_args(ac, av) || !*attuned_path || daemon_answers())
        return 0;
    char lockp[PATH_MAX + 8], logp[PATH_MAX + 8];
    snprintf(lockp, sizeof lockp, "%s.lock", socket_path);
    snprintf(logp, sizeof logp, "%s.log", socket_path);
    int lk = open(lockp, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (lk < 0 || flock(lk, LOCK_EX) != 0) {
        slurm_error("attune: cannot lock %s: %s", lockp, strerror(errno));
        if (lk >= 0)
            close(lk);
        return 0;
    }
    if (!daemon_answers()) {
        pid_t pid = fork();
        if (pid == 0) {
            /* Detached: its own session, no descriptor of slurmd's, and a grandchild so
             * that nobody waits for it. */
            setsid();
            if (fork() != 0)
                _exit(0);
            int null = open("/dev/null", O_RDONLY);
            int log = open(logp, O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW, 0600);
            if (null < 0 || log < 0)
                _exit(126);
            dup2(null, 0);
            dup2(log, 1);
            dup2(log, 2);
            for (int fd = 3; fd < 1024; fd++)
                close(fd);
            char *argv[] = {attuned_path, "--socket", socket_path, NULL, NULL, NULL};
            if (*attuned_config) {
                argv[3] = "--config";
                argv[4] = attuned_config;
            }
            execv(attuned_path, argv);
            _exit(127);
        }
        if (pid > 0)
            waitpid(pid, NULL, 0);
        int up = 0;
        for (int i = 0; i < 300 && !(up = daemon_answers()); i++)
            usleep(10000);
        if (up)
            slurm_info("attune: started %s on %s", attuned_path, socket_path);
        else
            slurm_error("attune: %s did not answer on %s within 3 s (its log: %s)", attuned_path,
                        socket_path, logp);
    }
    flock(lk, LOCK_UN);
    close(lk);
    return 0;
}

/* Empties the directory open at `dfd` (closing it): its files, and with `depth` its
 * subdirectories of the job's user (a job's per-node directories), never following a link. */
static void empty_dir(int dfd, uid_t uid, int depth)
{
    DIR *d = fdopendir(dfd);
    if (!d) {
        close(dfd);
        return;
    }
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        if (unlinkat(dfd, e->d_name, 0) == 0 || errno != EISDIR || !depth)
            continue;
        int sub = openat(dfd, e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        struct stat st;
        if (sub < 0)
            continue;
        if (fstat(sub, &st) != 0 || st.st_uid != uid) {
            close(sub);
            continue;
        }
        empty_dir(sub, uid, depth - 1);
        unlinkat(dfd, e->d_name, AT_REMOVEDIR);
    }
    closedir(d);
}

/* In slurmd (root) when the job ends on the node: its statistics directory goes. The
 * directories are the user's, so nothing is reached through a path the user could bend: each
 * level is opened without following links and must belong to the job's user, and entries
 * are unlinked relative to it (a link is removed, never followed). */
int slurm_spank_job_epilog(spank_t sp, int ac, char **av)
{
    (void)ac;
    (void)av;
    uint32_t job;
    uid_t uid;
    if (!job_ids(sp, &job, &uid))
        return 0;
    char base[64], name[16];
    snprintf(base, sizeof base, "/tmp/attune-slurm-%u", (unsigned)uid);
    snprintf(name, sizeof name, "%u", job);
    struct stat st;
    int bfd = open(base, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (bfd < 0)
        return 0;
    int dfd = -1;
    if (fstat(bfd, &st) == 0 && st.st_uid == uid)
        dfd = openat(bfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dfd >= 0 && (fstat(dfd, &st) != 0 || st.st_uid != uid)) {
        close(dfd);
        dfd = -1;
    }
    if (dfd >= 0) {
        empty_dir(dfd, uid, 1);
        unlinkat(bfd, name, AT_REMOVEDIR);
    }
    close(bfd);
    return 0;
}

static int set(spank_t sp, const char *k, const char *v)
{
    if (spank_setenv(sp, k, v, 1) != ESPANK_SUCCESS) {
        slurm_error("attune: cannot set %s for the task", k);
        return -1;
    }
    return 0;
}

/* Runs in each task as root, before it takes the job's user's identity. With
 * userfaultfd=device the task inherits a descriptor of /dev/userfaultfd (no close-on-exec):
 * the runtime makes its userfaultfds through it (ATTUNE_USERFAULTFD_FD), for its own memory
 * only, whoever opened the device. The site grants, per job of Attune, what the sysctl
 * would grant to every process of the node. A failure is logged and the task goes on with
 * what the user can open. */
int slurm_spank_task_init_privileged(spank_t sp, int ac, char **av)
{
    (void)ac;
    (void)av;
    if (!hand_userfaultfd || !active())
        return 0;
    int fd = open("/dev/userfaultfd", O_RDWR);
    if (fd < 0) {
        slurm_error("attune: userfaultfd=device: cannot open /dev/userfaultfd (%s); the task "
                    "gets what its user can open",
                    strerror(errno));
        return 0;
    }
    char num[16];
    snprintf(num, sizeof num, "%d", fd);
    if (spank_setenv(sp, "ATTUNE_USERFAULTFD_FD", num, 1) != ESPANK_SUCCESS) {
        slurm_error("attune: cannot set ATTUNE_USERFAULTFD_FD for the task");
        close(fd);
    }
    return 0;
}

/* Runs in each task, as the job's user, after fork and before exec. */
int slurm_spank_task_init(spank_t sp, int ac, char **av)
{
    (void)ac;
    (void)av;
    if (!opt_flags && !opt_dram && !opt_far && !opt_workflow && !opt_config)
        return 0;
    char buf[PATH_MAX * 2];

    if (access(preload_path, R_OK) != 0) {
        slurm_error("attune: the interposer %s cannot be read (%s): plugstack argument "
                    "preload= names it",
                    preload_path, strerror(errno));
        return -1;
    }
    char old[PATH_MAX * 2] = "";
    if (spank_getenv(sp, "LD_PRELOAD", old, sizeof old) == ESPANK_SUCCESS && *old)
        snprintf(buf, sizeof buf, "%s %s", preload_path, old);
    else
        snprintf(buf, sizeof buf, "%s", preload_path);
    if (set(sp, "LD_PRELOAD", buf))
        return -1;

    if (opt_flags && (set(sp, "ATTUNE_FLAGS", opt_flags) || set(sp, "TM_FLAGS", opt_flags)))
        return -1;
    if (opt_config && set(sp, "ATTUNE_CONFIG", opt_config))
        return -1;

    /* The budget. */
    uint64_t limit = cgroup_limit(), mb = 0;
    if (!limit && spank_get_item(sp, S_JOB_ALLOC_MEM, &mb) == ESPANK_SUCCESS && mb)
        limit = mb * MIB;
    uint32_t tasks = 1;
    if (spank_get_item(sp, S_JOB_LOCAL_TASK_COUNT, &tasks) != ESPANK_SUCCESS || !tasks)
        tasks = 1;
    uint64_t head = limit / 100 * headroom_pct;
    if (head < HEADROOM_FLOOR)
        head = HEADROOM_FLOOR;
    uint64_t budget = 0;
    uint64_t b = 0;
    double pct = 0;
    char why[256];
    if (opt_dram && attune_parse_size(opt_dram, &b, &pct, why, sizeof why) == 0) {
        if (pct > 0) {
            if (!limit) {
                slurm_error("attune: --tm-dram=%s: the job has no memory limit on this node to "
                            "take a percentage of; give a size",
                            opt_dram);
                return -1;
            }
            budget = (uint64_t)((double)limit * pct / 100.0) / tasks;
        } else {
            budget = b;
        }
        if (limit && budget * tasks > limit) {
            slurm_error("attune: --tm-dram=%s for %u task(s) is more than the job's memory on "
                        "this node (%llu MiB): it could not hold",
                        opt_dram, tasks, (unsigned long long)(limit / MIB));
            return -1;
        }
    } else if (limit) {
        if (limit <= head + tasks * 4 * MIB) {
            slurm_error("attune: the job's memory on this node (%llu MiB) leaves no DRAM budget "
                        "after the %llu MiB headroom: ask for more memory or give --tm-dram",
                        (unsigned long long)(limit / MIB), (unsigned long long)(head / MIB));
            return -1;
        }
        budget = (limit - head) / tasks;
    }
    if (budget) {
        snprintf(buf, sizeof buf, "%llu", (unsigned long long)budget);
        if (set(sp, "ATTUNE_DRAM", buf))
            return -1;
    }

    /* Far tiers: memory outside the job unless asked otherwise. */
    struct stat st;
    int daemon = stat(socket_path, &st) == 0 && S_ISSOCK(st.st_mode);
    const char *far = opt_far ? opt_far : daemon ? "pool,file" : "file";
    if (set(sp, "ATTUNE_FAR", far))
        return -1;
    if (strstr(far, "file")) {
        /* O_DIRECT: the file tier's pages must not come back as page cache charged to the
         * job. The user's own setting wins. */
        char cur[16];
        if (spank_getenv(sp, "ATTUNE_TIER_FILE_DIRECT", cur, sizeof cur) != ESPANK_SUCCESS &&
            set(sp, "ATTUNE_TIER_FILE_DIRECT", "true"))
            return -1;
    }
    if (set(sp, "ATTUNE_SOCKET", socket_path))
        return -1;
    if (*report_dir && set(sp, "ATTUNE_REPORT_DIR", report_dir))
        return -1;

    /* The workflow is the job (its array task). */
    if (opt_workflow) {
        snprintf(buf, sizeof buf, "%s", opt_workflow);
    } else {
        uint32_t job = 0, array = 0, atask = 0;
        spank_get_item(sp, S_JOB_ID, &job);
        /* A job that is no array task reports its own id and NO_VAL (0xfffffffe). */
        if (spank_get_item(sp, S_JOB_ARRAY_ID, &array) == ESPANK_SUCCESS && array &&
            spank_get_item(sp, S_JOB_ARRAY_TASK_ID, &atask) == ESPANK_SUCCESS &&
            atask < 0xfffffffeu)
            snprintf(buf, sizeof buf, "slurm-%u_%u", array, atask);
        else
            snprintf(buf, sizeof buf, "slurm-%u", job);
    }
    if (set(sp, "ATTUNE_WORKFLOW", buf))
        return -1;

    /* As under `attune run`: where the kernel cannot fault managed pages in for a peer, Open
     * MPI's single-copy transport fails; ranks copy through shared memory instead. */
    char cur[16];
    int handed = spank_getenv(sp, "ATTUNE_USERFAULTFD_FD", cur, sizeof cur) == ESPANK_SUCCESS;
    if (spank_getenv(sp, "OMPI_MCA_btl_vader_single_copy_mechanism", cur, sizeof cur) !=
            ESPANK_SUCCESS &&
        !handed && uffd_user_mode_only() &&
        set(sp, "OMPI_MCA_btl_vader_single_copy_mechanism", "none"))
        return -1;
    return 0;
}

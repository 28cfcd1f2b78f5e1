/* The JNI library of tests/run/JniHeapIo.java: whole-array file I/O through
 * GetPrimitiveArrayCritical pointers into the JVM's heap, as native libraries do. Short
 * counts are continued; EINTR is retried; any other error is returned as -errno, so the
 * Java side sees an EFAULT that reaches the program. */
#include <errno.h>
#include <fcntl.h>
#include <jni.h>
#include <unistd.h>

JNIEXPORT jint JNICALL Java_JniHeapIo_openScratch(JNIEnv *env, jclass cls, jstring path) {
    (void)cls;
    const char *p = (*env)->GetStringUTFChars(env, path, NULL);
    int fd = open(p, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    int err = errno;
    if (fd >= 0) unlink(p);
    (*env)->ReleaseStringUTFChars(env, path, p);
    return fd >= 0 ? fd : -err;
}

static jlong transfer(JNIEnv *env, jint fd, jbyteArray a, jlong off, jboolean positional, int put) {
    jsize n = (*env)->GetArrayLength(env, a);
    char *p = (*env)->GetPrimitiveArrayCritical(env, a, NULL);
    if (!p) return -ENOMEM;
    jlong done = 0;
    if (!positional && lseek(fd, off, SEEK_SET) < 0) done = -errno;
    while (done >= 0 && done < n) {
        ssize_t k;
        if (positional)
            k = put ? pwrite(fd, p + done, n - done, off + done) : pread(fd, p + done, n - done, off + done);
        else
            k = put ? write(fd, p + done, n - done) : read(fd, p + done, n - done);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) { done = -errno; break; }
        if (k == 0) break;
        done += k;
    }
    /* Copy back on a read (mode 0); nothing to copy after a write. */
    (*env)->ReleasePrimitiveArrayCritical(env, a, p, put ? JNI_ABORT : 0);
    return done;
}

JNIEXPORT jlong JNICALL Java_JniHeapIo_put(JNIEnv *env, jclass cls, jint fd, jbyteArray a, jlong off,
                                          jboolean positional) {
    (void)cls;
    return transfer(env, fd, a, off, positional, 1);
}

JNIEXPORT jlong JNICALL Java_JniHeapIo_get(JNIEnv *env, jclass cls, jint fd, jbyteArray a, jlong off,
                                          jboolean positional) {
    (void)cls;
    return transfer(env, fd, a, off, positional, 0);
}

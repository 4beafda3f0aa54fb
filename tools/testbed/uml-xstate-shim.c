/*
 * Licensed under the Apache License, Version 2.0 (the "License"); you may
 * not use this file except in compliance with the License. You may obtain
 * a copy of the License at
 *
 *      http://www.apache.org/licenses/LICENSE-2.0
 *
 * Unless required by applicable law or agreed to in writing, software
 * distributed under the License is distributed on an "AS IS" BASIS, WITHOUT
 * WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied. See the
 * License for the specific language governing permissions and limitations
 * under the License.
 *
 * LD_PRELOAD shim that lets Debian's user-mode-linux 6.1 run on a host
 * whose CPU has more XSAVE state than UML's buffer holds.
 *
 * UML saves and restores the FPU state of its processes with
 * PTRACE_GETREGSET / PTRACE_SETREGSET (NT_X86_XSTATE) through a buffer of
 * 2696 bytes (x87/SSE, AVX, AVX-512, PKRU).  The host kernel truncates a
 * short GETREGSET, but refuses a SETREGSET whose buffer is not exactly its
 * full XSAVE size (EFAULT): on a CPU with AMX that size is 11008 bytes,
 * and every process in the guest dies at its first context switch
 * ("userspace - ptrace set fp regs failed, errno = 14").
 *
 * A short SETREGSET is completed here: the target's current state is read
 * in full, the caller's bytes (which include the XSAVE header) are laid
 * over it, and the full buffer is written.  Components past the caller's
 * buffer (AMX tile state, which no guest process may use without asking
 * the host) keep what the target has.  Everything else passes through.
 */

#define _GNU_SOURCE
#include <cpuid.h>
#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <stdarg.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/types.h>
#include <sys/uio.h>

typedef long (*ptrace_fn)(int, pid_t, void *, void *);

/* The UML kernel runs on one host thread at a time: one buffer is enough. */
static unsigned char full_state[65536] __attribute__((aligned(64)));

static size_t host_xstate_size(void)
{
	unsigned int eax, ebx, ecx, edx;

	if (!__get_cpuid_count(0xd, 0, &eax, &ebx, &ecx, &edx))
		return 0;
	return ecx;
}

long ptrace(enum __ptrace_request request, ...)
{
	static ptrace_fn real_ptrace;
	struct iovec *iov, full;
	va_list ap;
	pid_t pid;
	void *addr, *data;
	size_t size;
	long ret;

	va_start(ap, request);
	pid = va_arg(ap, pid_t);
	addr = va_arg(ap, void *);
	data = va_arg(ap, void *);
	va_end(ap);
	if (!real_ptrace)
		real_ptrace = (ptrace_fn)dlsym(RTLD_NEXT, "ptrace");

	if (request != PTRACE_SETREGSET || (long)addr != NT_X86_XSTATE)
		return real_ptrace(request, pid, addr, data);
	iov = data;
	size = host_xstate_size();
	if (!iov || iov->iov_len >= size || size > sizeof(full_state))
		return real_ptrace(request, pid, addr, data);

	full.iov_base = full_state;
	full.iov_len = size;
	ret = real_ptrace(PTRACE_GETREGSET, pid, addr, &full);
	if (ret < 0)
		return ret;
	if (full.iov_len != size) {
		errno = EFAULT;
		return -1;
	}
	memcpy(full_state, iov->iov_base, iov->iov_len);
	return real_ptrace(PTRACE_SETREGSET, pid, addr, &full);
}

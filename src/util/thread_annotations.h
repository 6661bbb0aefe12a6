// Thread-safety annotations: macros over Clang's capability attributes, so that
// `clang++ -Wthread-safety` proves at compile time that a member marked GUARDED_BY(mu) is only
// touched with `mu` held and that a function marked REQUIRES(mu) is only called with it held.
// Under other compilers (GCC builds the project) every macro expands to nothing: they document
// the locking and cost nothing. Used with ember::Mutex / ember::MutexLock (util/mutex.h).
#pragma once

#if defined(__clang__)
#define EMBER_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define EMBER_THREAD_ANNOTATION(x)
#endif

// On a class: its instances are capabilities (locks) named `kind` in diagnostics.
#define CAPABILITY(kind) EMBER_THREAD_ANNOTATION(capability(kind))
// On an RAII class: its constructor acquires and its destructor releases a capability.
#define SCOPED_CAPABILITY EMBER_THREAD_ANNOTATION(scoped_lockable)
// On a data member: reads and writes need `mu` held.
#define GUARDED_BY(mu) EMBER_THREAD_ANNOTATION(guarded_by(mu))
// On a pointer member: the pointee (not the pointer) needs `mu` held.
#define PT_GUARDED_BY(mu) EMBER_THREAD_ANNOTATION(pt_guarded_by(mu))
// On a function: callers must hold the capabilities.
#define REQUIRES(...) EMBER_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
// On a function: it acquires / releases the capabilities (none listed: `this`).
#define ACQUIRE(...) EMBER_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define RELEASE(...) EMBER_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
// On a function: it tries to acquire and returns `result` on success.
#define TRY_ACQUIRE(...) EMBER_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
// On a function: callers must NOT hold the capabilities (it takes them itself).
#define EXCLUDES(...) EMBER_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
// On a function: it returns a reference to the capability.
#define RETURN_CAPABILITY(x) EMBER_THREAD_ANNOTATION(lock_returned(x))
// On a function: the analysis skips its body (say why next to each use).
#define NO_THREAD_SAFETY_ANALYSIS EMBER_THREAD_ANNOTATION(no_thread_safety_analysis)

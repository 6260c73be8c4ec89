/*
 * nxmem_plugin_helpers.h: what every plugin written in C needs around nxmem_memory_abi.h and
 * would otherwise copy out of the example: writing a status, checking a request and an output,
 * and writing an output within the size its receiver declared. Each helper implements rules of
 * docs/ABI.md, named at the helper.
 *
 * C11 or C++, no dependency but the C standard library and the contract header. Every function
 * is static inline: nothing is exported, so including this header changes no plugin's exports.
 * It uses nothing newer than minor 0 of the contract, so it works with every header of major 1.
 */
#ifndef NXMEM_PLUGIN_HELPERS_H
#define NXMEM_PLUGIN_HELPERS_H

#include "nxmem_memory_abi.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#if defined(__GNUC__) || defined(__clang__)
#define NXMEM_HELPERS_PRINTF(format_at, arguments_at)                                              \
    __attribute__((format(printf, format_at, arguments_at)))
#else
#define NXMEM_HELPERS_PRINTF(format_at, arguments_at)
#endif

/* The bytes a sender of `type` up to `field` provides: the end of that field, not sizeof (which
 * may include padding, and grows with every minor). The baseline of a struct is NXMEM_FIELD_END
 * of its last minor-0 field (ABI.md Q2). */
#define NXMEM_FIELD_END(type, field) (offsetof(type, field) + sizeof(((type *)0)->field))

/* Cuts a truncated `message` before a UTF-8 sequence the truncation left incomplete at its end
 * (ABI.md E4: a message is never split inside a UTF-8 sequence). */
static inline void nxmem_drop_split_utf8_tail(char *message) {
    size_t lead = strlen(message);
    size_t continuations = 0;
    while (lead > 0 && continuations < 3 && ((unsigned char)message[lead - 1] & 0xC0u) == 0x80u) {
        --lead;
        ++continuations;
    }
    if (lead == 0) {
        return;
    }
    const unsigned char first = (unsigned char)message[lead - 1];
    const size_t expected = first >= 0xF0u ? 4u : first >= 0xE0u ? 3u : first >= 0xC0u ? 2u : 1u;
    if (expected > 1u && continuations + 1u < expected) {
        message[lead - 1] = '\0';
    }
}

/* The status writer, varargs form (ABI.md E3, E4): writes `code` if struct_size covers it, and a
 * formatted message, never past struct_size nor the NXMEM_STATUS_MESSAGE_BYTES buffer, truncated
 * to fit without splitting a UTF-8 sequence and always NUL-terminated. A NULL `status` (E10) receives
 * nothing. Returns `code`: the returned code, not the status, is what the host trusts (E3). */
static inline NxmemStatusCode nxmem_report_v(NxmemStatus *status, NxmemStatusCode code,
                                             const char *format, va_list arguments) {
    if (status == NULL) {
        return code;
    }
    const size_t capacity = status->struct_size;
    if (capacity >= NXMEM_FIELD_END(NxmemStatus, code)) {
        status->code = code;
    }
    if (capacity > offsetof(NxmemStatus, message)) {
        size_t room = capacity - offsetof(NxmemStatus, message);
        if (room > NXMEM_STATUS_MESSAGE_BYTES) {
            room = NXMEM_STATUS_MESSAGE_BYTES;
        }
        const int length = vsnprintf(status->message, room, format, arguments);
        if (length < 0) {
            status->message[0] = '\0'; /* an encoding error leaves an empty, terminated message */
        } else if ((size_t)length >= room) {
            nxmem_drop_split_utf8_tail(status->message);
        }
    }
    return code;
}

/* The status writer (ABI.md E3, E4): nxmem_report_v with a printf-style argument list. */
static inline NxmemStatusCode nxmem_report(NxmemStatus *status, NxmemStatusCode code,
                                           const char *format, ...) NXMEM_HELPERS_PRINTF(3, 4);
static inline NxmemStatusCode nxmem_report(NxmemStatus *status, NxmemStatusCode code,
                                           const char *format, ...) {
    va_list arguments;
    va_start(arguments, format);
    nxmem_report_v(status, code, format, arguments);
    va_end(arguments);
    return code;
}

/* The extensible-struct rule for a request the plugin receives (ABI.md Q2-Q5): `request` is not
 * NULL; its struct_size is at least `baseline` and at most NXMEM_MAX_STRUCT_SIZE (checked before
 * any byte is scanned); every byte
 * from `known` (the size of the struct as this plugin's header defines it) up to struct_size is
 * zero, so a newer host's request is accepted exactly when it asks for nothing the plugin cannot
 * honour; no byte past struct_size is read. Returns OK, or INVALID_ARGUMENT with a message naming
 * `what` and the fault. */
static inline NxmemStatusCode nxmem_check_request(const void *request, size_t baseline,
                                                  size_t known, const char *what,
                                                  NxmemStatus *status) {
    if (request == NULL) {
        return nxmem_report(status, NXMEM_STATUS_INVALID_ARGUMENT, "%s: NULL request", what);
    }
    uint32_t size = 0;
    memcpy(&size, request, sizeof size);
    if (size < baseline || size > NXMEM_MAX_STRUCT_SIZE) {
        return nxmem_report(status, NXMEM_STATUS_INVALID_ARGUMENT,
                            "%s: struct_size %u is outside [%zu, %u]", what, (unsigned)size,
                            baseline, (unsigned)NXMEM_MAX_STRUCT_SIZE);
    }
    const unsigned char *bytes = (const unsigned char *)request;
    for (size_t at = known; at < size; ++at) {
        if (bytes[at] != 0) {
            return nxmem_report(status, NXMEM_STATUS_INVALID_ARGUMENT,
                                "%s: byte %zu is beyond the %zu bytes this plugin knows and is "
                                "not zero",
                                what, at, known);
        }
    }
    return NXMEM_STATUS_OK;
}

/* nxmem_check_request for a `type` whose minor-0 fields end with `last_field` (ABI.md Q2-Q5). */
#define NXMEM_CHECK_REQUEST(type, last_field, request, status)                                     \
    nxmem_check_request((request), NXMEM_FIELD_END(type, last_field), sizeof(type), #type, (status))

/* An output the plugin writes (ABI.md Q7): `out` is not NULL and its struct_size, set by the
 * receiver, holds at least the `baseline` struct. Returns OK, or INVALID_ARGUMENT naming `what`
 * with the output left untouched.
 * Write the output with nxmem_copy_output only after this returned OK. */
static inline NxmemStatusCode nxmem_check_output(const void *out, size_t baseline, const char *what,
                                                 NxmemStatus *status) {
    uint32_t size = 0;
    if (out != NULL) {
        memcpy(&size, out, sizeof size);
    }
    if (size < baseline) {
        return nxmem_report(status, NXMEM_STATUS_INVALID_ARGUMENT,
                            "%s: output missing or struct_size %u below %zu", what, (unsigned)size,
                            baseline);
    }
    return NXMEM_STATUS_OK;
}

/* nxmem_check_output for a `type` whose minor-0 fields end with `last_field` (ABI.md Q7). */
#define NXMEM_CHECK_OUTPUT(type, last_field, out, status)                                          \
    nxmem_check_output((out), NXMEM_FIELD_END(type, last_field), #type, (status))

/* Writes the plugin's `value` (a struct of `known` bytes, sizeof as this plugin knows it) into an
 * output that nxmem_check_output accepted (ABI.md Q6): only up to the struct_size the receiver
 * set, and that struct_size itself is kept, so the receiver learns which fields were written. */
static inline void nxmem_copy_output(void *out, const void *value, size_t known) {
    uint32_t size = 0;
    memcpy(&size, out, sizeof size);
    const size_t count = (size < known ? size : known) - sizeof size;
    memcpy((unsigned char *)out + sizeof size, (const unsigned char *)value + sizeof size, count);
}

#endif /* NXMEM_PLUGIN_HELPERS_H */

/*
 * nxmem_plugin_helpers.h: what every plugin written in C needs around nxmem_memory_abi.h and
 * would otherwise copy out of the example: writing a status, checking a request and an output,
 * writing an output within the size its receiver declared, and reading the open options. Each
 * helper implements rules of docs/ABI.md, named at the helper.
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

/* ABI.md M1: whether an object's device is this allocator's (same type and index). */
static inline int nxmem_same_device(const NxmemDeviceId *a, const NxmemDeviceId *b) {
    return a->device_type == b->device_type && a->index == b->index;
}

/* ABI.md Q16, at open_allocator: refuses with WRONG_DEVICE, naming `mechanism` and the device, a
 * device whose type is not among `device_types` (bits 1 << NXMEM_DEVICE_...) or whose index is
 * outside [0, indices). Returns OK otherwise. */
static inline NxmemStatusCode nxmem_check_device(const NxmemDeviceId *device, uint64_t device_types,
                                                 int32_t indices, const char *mechanism,
                                                 NxmemStatus *status) {
    if (device->device_type >= 64 || ((device_types >> device->device_type) & 1u) == 0) {
        return nxmem_report(status, NXMEM_STATUS_WRONG_DEVICE,
                            "%s does not serve device type %u", mechanism,
                            (unsigned)device->device_type);
    }
    if (device->index < 0 || device->index >= indices) {
        return nxmem_report(status, NXMEM_STATUS_WRONG_DEVICE,
                            "%s serves indices 0 to %d of device type %u, not %d", mechanism,
                            (int)(indices - 1), (unsigned)device->device_type, (int)device->index);
    }
    return NXMEM_STATUS_OK;
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

/* ---- open options (ABI.md X9) ----
 * `NxmemOpenRequest::options` is `options_length` bytes (not NUL-terminated) of entries separated
 * by ';' or '\n'. Each entry is trimmed of spaces, tabs and CRs; an empty entry is skipped; a
 * non-empty one is key=value split at its first '=', key and value trimmed, the key non-empty, the
 * value possibly empty. The kit's nxmem::plugin::options reads the same grammar. */

/* Copies `length` bytes of `text` (the host's bytes, an option say) into `out` (`capacity` bytes,
 * NUL-terminated) for a message: printable ASCII as it is, every other byte as \xNN, so a message
 * never echoes a raw byte (ABI.md E13). Stops before an escape that would not fit whole. */
static inline void nxmem_printable(char *out, size_t capacity, const char *text, size_t length) {
    static const char digits[] = "0123456789abcdef";
    size_t written = 0;
    if (capacity == 0) {
        return;
    }
    for (size_t at = 0; at < length; ++at) {
        const unsigned char byte = (unsigned char)text[at];
        const int plain = byte >= 0x20u && byte < 0x7Fu && byte != '\\';
        const size_t needed = plain ? 1u : 4u;
        if (written + needed >= capacity) {
            break;
        }
        if (plain) {
            out[written++] = (char)byte;
        } else {
            out[written++] = '\\';
            out[written++] = 'x';
            out[written++] = digits[byte >> 4];
            out[written++] = digits[byte & 0xFu];
        }
    }
    out[written] = '\0';
}

/* One entry: pointers into the caller's options text, not NUL-terminated. */
typedef struct NxmemOptionEntry {
    const char *key;
    size_t key_length;
    const char *value;
    size_t value_length;
} NxmemOptionEntry;

static inline int nxmem_option_blank(char c) { return c == ' ' || c == '\t' || c == '\r'; }

/* Trims [*first, *last) of spaces, tabs and CRs. */
static inline void nxmem_option_trim(const char **first, const char **last) {
    while (*first < *last && nxmem_option_blank(**first)) {
        ++*first;
    }
    while (*last > *first && nxmem_option_blank((*last)[-1])) {
        --*last;
    }
}

/* Reads the next entry of [*cursor, end) into `entry` and advances *cursor past it. Returns 1 for
 * an entry, 0 at the end of the text, or INVALID_ARGUMENT (written to `status`, naming the entry)
 * for an entry without '=' or with an empty key. Repeated keys: see nxmem_option_check_unique. */
static inline int nxmem_option_next(const char **cursor, const char *end, NxmemOptionEntry *entry,
                                    NxmemStatus *status) {
    while (*cursor < end) {
        const char *first = *cursor;
        const char *stop = first;
        while (stop < end && *stop != ';' && *stop != '\n') {
            ++stop;
        }
        *cursor = stop < end ? stop + 1 : end;
        const char *last = stop;
        nxmem_option_trim(&first, &last);
        if (first == last) {
            continue; /* an empty entry */
        }
        const char *equals = (const char *)memchr(first, '=', (size_t)(last - first));
        const char *key_last = equals == NULL ? first : equals;
        const char *key_first = first;
        nxmem_option_trim(&key_first, &key_last);
        if (equals == NULL || key_first == key_last) {
            char shown[96];
            nxmem_printable(shown, sizeof shown, first, last - first > 64 ? 64u : (size_t)(last - first));
            nxmem_report(status, NXMEM_STATUS_INVALID_ARGUMENT,
                         "option '%s' is not of the form key=value", shown);
            return -1;
        }
        const char *value_first = equals + 1;
        const char *value_last = last;
        nxmem_option_trim(&value_first, &value_last);
        entry->key = key_first;
        entry->key_length = (size_t)(key_last - key_first);
        entry->value = value_first;
        entry->value_length = (size_t)(value_last - value_first);
        return 1;
    }
    return 0;
}

/* Checks a whole options text: at most NXMEM_MAX_OPTIONS_BYTES, every entry well formed, no key
 * given twice. Returns OK or INVALID_ARGUMENT naming the fault. Call it first; then read the
 * entries with nxmem_option_next and refuse any key the mechanism does not know. */
static inline NxmemStatusCode nxmem_option_check(const char *options, uint64_t length,
                                                 NxmemStatus *status) {
    if (length == 0) {
        return NXMEM_STATUS_OK;
    }
    if (options == NULL || length > NXMEM_MAX_OPTIONS_BYTES) {
        return nxmem_report(status, NXMEM_STATUS_INVALID_ARGUMENT,
                            "options: NULL, or %llu bytes over %u", (unsigned long long)length,
                            (unsigned)NXMEM_MAX_OPTIONS_BYTES);
    }
    const char *end = options + length;
    const char *outer = options;
    NxmemOptionEntry entry;
    int found;
    while ((found = nxmem_option_next(&outer, end, &entry, status)) == 1) {
        const char *inner = outer;
        NxmemOptionEntry later;
        int again;
        while ((again = nxmem_option_next(&inner, end, &later, status)) == 1) {
            if (later.key_length == entry.key_length &&
                memcmp(later.key, entry.key, entry.key_length) == 0) {
                char shown[96];
                nxmem_printable(shown, sizeof shown, entry.key,
                                entry.key_length > 64 ? 64u : entry.key_length);
                return nxmem_report(status, NXMEM_STATUS_INVALID_ARGUMENT,
                                    "option '%s' given twice", shown);
            }
        }
        if (again < 0) {
            return NXMEM_STATUS_INVALID_ARGUMENT;
        }
    }
    return found < 0 ? NXMEM_STATUS_INVALID_ARGUMENT : NXMEM_STATUS_OK;
}

#endif /* NXMEM_PLUGIN_HELPERS_H */

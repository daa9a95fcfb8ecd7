// embed-msl: writes the Metal library's MSL source as a Swift string literal, for the
// EmbedMSL build plugin (Plugins/EmbedMSL).
//
//     embed-msl <library.txt> <package directory> <output.swift>
//     embed-msl --msl <library.txt> <package directory> <output.metal>
//
// (--msl writes the assembled source itself, for Apple's offline compiler: `xcrun metal`
// then checks on a Mac without a GPU what makeLibrary(source:) would compile; see
// scripts/assemble-msl.sh.)
//
// The kernel files of the list, in order, each `#include "x.h"` replaced by the file it
// names (found next to the including file, then in the list's include folders; pasted
// at every include, as a preprocessor would, so include guards drop repeats), with
// `#line` markers so that the Metal compiler's messages name the original file and line.
// Apple's makeLibrary(source:) cannot resolve includes, so this is the one place they are
// pasted. Paths in the markers are relative to the package directory, so the output
// does not depend on where the checkout lies.
//
// C: the tool needs nothing but the C library, and it builds in a moment.
//
// The output is rewritten only when its text changes, so that a run caused by a touched
// file recompiles nothing.
#define _POSIX_C_SOURCE 200809L  // strdup, strndup under a strict -std

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

enum { MAX_FOLDERS = 16, MAX_KERNELS = 64, MAX_DEPTH = 32 };

typedef struct {
    char* p;
    size_t n, cap;
} text;

static void fail(const char* format, ...) {
    va_list args;
    va_start(args, format);
    fputs("embed-msl: error: ", stderr);
    vfprintf(stderr, format, args);
    fputc('\n', stderr);
    va_end(args);
    exit(1);
}

static void append(text* t, const char* s, size_t n) {
    if (t->n + n + 1 > t->cap) {
        t->cap = (t->n + n + 1) * 2;
        if ((t->p = realloc(t->p, t->cap)) == NULL) fail("out of memory");
    }
    memcpy(t->p + t->n, s, n);
    t->n += n;
    t->p[t->n] = 0;
}

static void appendf(text* t, const char* format, ...) {
    char buffer[4096];
    va_list args;
    va_start(args, format);
    const int n = vsnprintf(buffer, sizeof buffer, format, args);
    va_end(args);
    if (n < 0 || (size_t)n >= sizeof buffer) fail("line too long");
    append(t, buffer, (size_t)n);
}

// The whole file, NUL-terminated; NULL if it cannot be read.
static char* read_file(const char* path) {
    FILE* f = fopen(path, "rb");
    if (f == NULL) return NULL;
    text t = {0};
    char buffer[65536];
    size_t n;
    while ((n = fread(buffer, 1, sizeof buffer, f)) > 0) append(&t, buffer, n);
    const int error = ferror(f);
    fclose(f);
    if (error) return NULL;
    if (t.p == NULL) append(&t, "", 0);
    return t.p;
}

static int is_file(const char* path) {
    struct stat info;
    return stat(path, &info) == 0 && S_ISREG(info.st_mode);
}

// `a/./b/../c` -> `a/c`, lexically; the result is malloc'ed.
static char* normalized(const char* path) {
    char* copy = strdup(path);
    char* parts[256];
    int count = 0;
    for (char* part = strtok(copy, "/"); part != NULL; part = strtok(NULL, "/")) {
        if (strcmp(part, ".") == 0) continue;
        if (strcmp(part, "..") == 0 && count > 0 && strcmp(parts[count - 1], "..") != 0) {
            count--;
            continue;
        }
        if (count == 256) fail("path too deep: %s", path);
        parts[count++] = part;
    }
    text t = {0};
    if (path[0] == '/') append(&t, "/", 1);
    for (int i = 0; i < count; i++) {
        if (i) append(&t, "/", 1);
        append(&t, parts[i], strlen(parts[i]));
    }
    if (t.p == NULL) append(&t, ".", 1);
    free(copy);
    return t.p;
}

static char* joined(const char* folder, const char* name, size_t name_length) {
    text t = {0};
    appendf(&t, "%s/%.*s", folder, (int)name_length, name);
    char* path = normalized(t.p);
    free(t.p);
    return path;
}

static char* folder_of(const char* path) {
    const char* slash = strrchr(path, '/');
    return slash ? strndup(path, (size_t)(slash - path)) : strdup(".");
}

static struct {
    char* package;  // normalized, no trailing slash
    char* folders[MAX_FOLDERS];
    int folder_count;
    char* kernels[MAX_KERNELS];
    int kernel_count;
} library;

// A path as the output names it: relative to the package directory when inside it.
static const char* shown(const char* path) {
    const size_t n = strlen(library.package);
    return strncmp(path, library.package, n) == 0 && path[n] == '/' ? path + n + 1 : path;
}

// library.txt: `include <folder>` and `kernels <file>` lines, paths relative to its folder.
static void read_list(const char* path) {
    char* contents = read_file(path);
    if (contents == NULL) fail("cannot read %s", path);
    char* base = folder_of(path);
    int number = 0;
    for (char* line = contents; line != NULL;) {
        char* end = strchr(line, '\n');
        if (end) *end = 0;
        number++;
        char key[32], value[1024], extra[2];
        const int words = sscanf(line, " %31s %1023s %1s", key, value, extra);
        if (words > 0 && key[0] != '#') {
            if (words != 2) fail("%s:%d: expected `include <folder>` or `kernels <file>`", path, number);
            if (strcmp(key, "include") == 0 && library.folder_count < MAX_FOLDERS) {
                library.folders[library.folder_count++] = joined(base, value, strlen(value));
            } else if (strcmp(key, "kernels") == 0 && library.kernel_count < MAX_KERNELS) {
                library.kernels[library.kernel_count++] = joined(base, value, strlen(value));
            } else {
                fail("%s:%d: unknown entry `%s` (or too many)", path, number, key);
            }
        }
        line = end ? end + 1 : NULL;
    }
    free(base);
    free(contents);
}

// The name of `#include "name"` on this line (its length in *length), or NULL.
static const char* quoted_include(const char* line, const char* end, size_t* length) {
    const char* p = line;
    while (p < end && (*p == ' ' || *p == '\t')) p++;
    if (p == end || *p++ != '#') return NULL;
    while (p < end && (*p == ' ' || *p == '\t')) p++;
    if (end - p < 7 || strncmp(p, "include", 7) != 0) return NULL;
    p += 7;
    while (p < end && (*p == ' ' || *p == '\t')) p++;
    if (p == end || *p++ != '"') return NULL;
    const char* name = p;
    while (p < end && *p != '"') p++;
    if (p == end) return NULL;
    *length = (size_t)(p - name);
    return name;
}

static void paste(text* out, const char* path, int depth) {
    if (depth >= MAX_DEPTH) fail("%s: includes nested %d deep (a header that includes itself without a guard?)", shown(path), MAX_DEPTH);
    char* contents = read_file(path);
    if (contents == NULL) fail("cannot read %s", path);
    char* folder = folder_of(path);
    appendf(out, "#line 1 \"%s\"\n", shown(path));
    const char* end_of_file = contents + strlen(contents);
    int number = 0;
    // A file's final newline ends its last line; it does not start another one.
    for (const char* line = contents; line < end_of_file;) {
        const char* newline = memchr(line, '\n', (size_t)(end_of_file - line));
        const char* end = newline ? newline : end_of_file;
        number++;
        size_t length;
        const char* name = quoted_include(line, end, &length);
        if (name == NULL) {
            append(out, line, (size_t)(end - line));
            append(out, "\n", 1);
        } else {
            char* found = joined(folder, name, length);
            for (int i = 0; !is_file(found) && i < library.folder_count; i++) {
                free(found);
                found = joined(library.folders[i], name, length);
            }
            if (!is_file(found)) {
                fail("%s:%d: #include \"%.*s\" is in neither %s nor the include folders of the list", shown(path), number,
                     (int)length, name, shown(folder));
            }
            paste(out, found, depth + 1);
            appendf(out, "#line %d \"%s\"\n", number + 1, shown(path));
            free(found);
        }
        line = newline ? newline + 1 : end_of_file;
    }
    free(folder);
    free(contents);
}

// Writes `t` to `path` unless the file holds that text already.
static void write_if_changed(const char* path, const text* t) {
    char* old = read_file(path);
    const int same = old != NULL && strcmp(old, t->p) == 0;
    free(old);
    if (same) return;
    FILE* f = fopen(path, "wb");
    if (f == NULL) fail("cannot write %s", path);
    const size_t written = fwrite(t->p, 1, t->n, f);
    if (fclose(f) != 0 || written != t->n) fail("cannot write %s", path);
}

// The source's identity: a kernel whose name is the FNV-1a hash of everything before it,
// appended to the source. A precompiled library (a metallib built from this same text,
// scripts/build-metallib.sh) holds the function; MetalContext loads a metallib only if it
// does, so that one built from another version of the source is never used.
static void append_identity(text* source) {
    uint64_t hash = 1469598103934665603ull;
    for (size_t i = 0; i < source->n; i++) hash = (hash ^ (unsigned char)source->p[i]) * 1099511628211ull;
    appendf(source, "\n// The identity of this source (Sources/embed-msl): a precompiled library of it has this function.\n"
                    "kernel void moe_source_%016llx() {}\n", (unsigned long long)hash);
}

// The Swift file that holds `source` (assembled from `list`) as MetalSources.library.
static text swift_file(const text* source, const char* list) {
    // A raw string literal with enough #s that nothing in the source closes it or escapes.
    char hashes[64] = "#";
    for (;;) {
        char quote[70], backslash[70];
        snprintf(quote, sizeof quote, "\"%s", hashes);
        snprintf(backslash, sizeof backslash, "\\%s", hashes);
        if (!strstr(source->p, quote) && !strstr(source->p, backslash)) break;
        if (strlen(hashes) + 1 >= sizeof hashes) fail("cannot quote the source");
        strcat(hashes, "#");
    }

    text out = {0};
    appendf(&out, "// Generated at build time by Plugins/EmbedMSL from %s: not kept in the repository.\n\n", shown(list));
    appendf(&out, "enum MetalSources {\n    /// The Metal library's source (see Sources/embed-msl).\n");
    // A multi-line literal drops the newline before its closing delimiter: one more keeps
    // the source's own final newline.
    appendf(&out, "    static let library = %s\"\"\"\n", hashes);
    append(&out, source->p, source->n);
    appendf(&out, "\n\"\"\"%s\n\n    /// Its kernel files, in order.\n    static let kernelFiles = [", hashes);
    for (int i = 0; i < library.kernel_count; i++) appendf(&out, "%s\"%s\"", i ? ", " : "", shown(library.kernels[i]));
    appendf(&out, "]\n}\n");
    return out;
}

int main(int argc, char** argv) {
    const int msl = argc == 5 && strcmp(argv[1], "--msl") == 0;
    if (argc != 4 && !msl) {
        fail("usage: embed-msl [--msl] <library.txt> <package directory> <output.swift, or with --msl output.metal>");
    }
    argv += msl;
    library.package = normalized(argv[2]);
    char* list = normalized(argv[1]);
    read_list(list);

    text source = {0};
    for (int i = 0; i < library.kernel_count; i++) paste(&source, library.kernels[i], 0);
    if (source.p == NULL) append(&source, "", 0);
    append_identity(&source);
    if (msl) {
        write_if_changed(argv[3], &source);
    } else {
        text out = swift_file(&source, list);
        write_if_changed(argv[3], &out);
        free(out.p);
    }
    // Freed, not left to exit: a build with --sanitize=address builds this tool with
    // LeakSanitizer too, which would fail the build over them.
    free(source.p);
    free(list);
    for (int i = 0; i < library.kernel_count; i++) free(library.kernels[i]);
    for (int i = 0; i < library.folder_count; i++) free(library.folders[i]);
    free(library.package);
    return 0;
}

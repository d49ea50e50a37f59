/* chat_tokens.c: conversations to input ids and loss masks (chat_tokens.h): render, encode
 * the whole text once, then each span edge as a token index by SPEC.md section 8's rule; and
 * JSON Lines files mapped with their lines indexed, a line a run reads copied out through a
 * guarded read (base/mapped.h: EIO naming the file, not SIGBUS, when the file is cut under it).
 * Not here: the templates (chat_template.c), the BPE (tokenizer.c), counts.
 * Tested by tests/engine/data/test_chat_tokens.c.
 *
 * Legend: T tokens of a conversation, n edges.
 */
#include "chat_tokens.h"
#include "ddk.h"
#include "base/errors.h"
#include "base/mapped.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* ------------------------------------------------------------------------------------------
 * The encoder: the template against the tokenizer
 */

/* the control tokens each template writes, and whether they must be special */
typedef struct control_token {
    const char *text;
    int special;
} control_token;

static const control_token qwen_controls[] = {
    { "<|im_start|>", 1 }, { "<|im_end|>", 1 }, { "<think>", 0 }, { "</think>", 0 },
    { "<tool_call>", 0 }, { "</tool_call>", 0 }, { "<tool_response>", 0 }, { "</tool_response>", 0 },
};

int ddt_chat_encoder_init(ddt_chat_encoder *e, const ddt_tokenizer *tok, const ddt_chat_template_options *opt,
                          char *err, size_t err_len)
{
    memset(e, 0, sizeof *e);
    const char *name = ddt_chat_template_name(opt->tmpl);
    for (size_t i = 0; i < sizeof qwen_controls / sizeof *qwen_controls; i++) {
        const control_token *c = &qwen_controls[i];
        const int32_t id = ddt_tokenizer_token_id(tok, c->text);
        size_t len = 0;
        const char *bytes = id >= 0 ? ddt_tokenizer_token_bytes(tok, id, &len) : NULL;
        /* an added token's bytes are its content; a vocabulary token's are the bytes it stands for */
        if (id < 0 || !bytes || len != strlen(c->text) || (c->special && !ddt_tokenizer_is_special(tok, id)))
            return ddt_fail(err, err_len, -EINVAL, "the tokenizer has no %stoken `%s`: template %s does not match it "
                            "(give the template of the tokenizer's model)", c->special ? "special " : "", c->text,
                            name);
    }
    e->tok = tok;
    e->opt = *opt;
    e->im_end = ddt_tokenizer_token_id(tok, "<|im_end|>");
    const int32_t V = ddt_tokenizer_vocab_size(tok);
    int n = 0;
    for (int32_t id = 0; id < V; id++)
        n += ddt_tokenizer_is_special(tok, id);
    e->specials = calloc((size_t)n + 1, sizeof *e->specials);
    if (!e->specials)
        return ddt_fail(err, err_len, -ENOMEM, "chat encoder: out of memory");
    for (int32_t id = 0; id < V; id++) {
        size_t len;
        const char *bytes = ddt_tokenizer_is_special(tok, id) ? ddt_tokenizer_token_bytes(tok, id, &len) : NULL;
        if (!bytes)
            continue;
        char *copy = malloc(len + 1);
        if (!copy) {
            ddt_chat_encoder_free(e);
            return ddt_fail(err, err_len, -ENOMEM, "chat encoder: out of memory");
        }
        memcpy(copy, bytes, len);
        copy[len] = '\0';
        e->specials[e->opt.n_special_tokens++] = copy;
    }
    e->opt.special_tokens = (const char *const *)e->specials;
    return 0;
}

void ddt_chat_encoder_free(ddt_chat_encoder *e)
{
    for (int i = 0; e->specials && i < e->opt.n_special_tokens; i++)
        free(e->specials[i]);
    free(e->specials);
    memset(e, 0, sizeof *e);
}

/* ------------------------------------------------------------------------------------------
 * Encoding
 */

void ddt_chat_tokens_free(ddt_chat_tokens *t)
{
    ddt_token_ids_free(&t->ids);
    free(t->mask);
    memset(t, 0, sizeof *t);
}

int ddt_chat_mask_trainable(const uint8_t *mask, size_t n)
{
    for (size_t i = 0; i + 1 < n; i++)
        if (mask[i] && mask[i + 1])
            return 1;
    return 0;
}

static ddt_chat_refusal encoding_failed(int rc, char *err, size_t err_len)
{
    if (rc == -ENOMEM)
        ddk_fatal(__FILE__, __LINE__, "out of memory encoding a conversation: %s", err);
    return DDT_CHAT_BAD_UTF8;   /* -EILSEQ: err names the byte */
}

/* The token index of each byte edge (ascending, n of them) of text (len bytes), whose whole
 * encoding is ids: SPEC.md 8's len(encode(text[:edge])), as the tokens up to the last special
 * token that ends at or before the edge (added tokens are split out before normalisation, so a
 * prefix ending after one has the same tokens before it) plus the tokens of the piece from its
 * end to the edge. The special tokens are found in the text itself, where NFC has not changed
 * anything yet: adding up the tokens' bytes would count the normalised text's, whose length NFC
 * changes (decomposed accents, Hangul jamo), and shift every later edge. A special token whose
 * place is not exactly its text (a normalized one) ends the shortcut: every later edge is
 * encoded from the last base, which is slower and as exact. */
static ddt_chat_refusal edge_tokens(const ddt_chat_encoder *e, const char *text, size_t len,
                                    const ddt_token_ids *ids, const size_t *edges, int n, int64_t *index,
                                    char *err, size_t err_len)
{
    int64_t base = 0;             /* tokens before base_byte */
    size_t base_byte = 0;
    size_t next = 0;              /* ids[next..]: where the next special token's id is looked for */
    int have = 0, usable = 1;     /* have: the next special token is known (its place and index) */
    size_t special_at = 0, special_end = 0, special_index = 0;
    ddt_token_ids piece = { 0 };
    for (int k = 0; k < n; k++) {
        while (usable) {
            if (!have) {
                int32_t id;
                size_t where, tlen;
                int found = ddt_tokenizer_find_special(e->tok, text + base_byte, len - base_byte, &id, &where, err,
                                                       err_len);
                if (found < 0) {
                    ddt_token_ids_free(&piece);
                    return encoding_failed(found, err, err_len);
                }
                while (next < ids->count && !ddt_tokenizer_is_special(e->tok, ids->ids[next]))
                    next++;
                const char *bytes = found ? ddt_tokenizer_token_bytes(e->tok, id, &tlen) : NULL;
                special_at = base_byte + where;
                if (!found || next == ids->count || ids->ids[next] != id || special_at + tlen > len ||
                    memcmp(text + special_at, bytes, tlen)) {
                    usable = 0;   /* no more, or not where its text is: encode from the last base */
                    break;
                }
                special_end = special_at + tlen;
                special_index = next;
                have = 1;
            }
            if (special_end > edges[k])
                break;
            base = (int64_t)special_index + 1;
            base_byte = special_end;
            next = special_index + 1;
            have = 0;
        }
        piece.count = 0;
        int rc = ddt_tokenizer_encode(e->tok, text + base_byte, edges[k] - base_byte, DDT_TOKENIZE_ADDED, &piece,
                                      err, err_len);
        if (rc) {
            ddt_token_ids_free(&piece);
            return encoding_failed(rc, err, err_len);
        }
        index[k] = base + (int64_t)piece.count;
    }
    ddt_token_ids_free(&piece);
    return DDT_CHAT_OK;
}

static void grow_mask(ddt_chat_tokens *out, size_t T)
{
    if (T <= out->mask_cap)
        return;
    uint8_t *grown = realloc(out->mask, T);
    if (!grown)
        ddk_fatal(__FILE__, __LINE__, "out of memory for a loss mask of %zu tokens", T);
    out->mask = grown;
    out->mask_cap = T;
}

ddt_chat_refusal ddt_chat_tokens_encode(const ddt_chat_encoder *e, const ddt_chat *chat, int64_t max_len,
                                        ddt_chat_tokens *out, char *err, size_t err_len)
{
    out->ids.count = 0;
    out->masked = 0;
    out->truncated = 0;
    ddt_chat_rendered r;
    ddt_chat_refusal why = ddt_chat_render(chat, &e->opt, &r, err, err_len);
    if (why)
        return why;
    int rc = ddt_tokenizer_encode(e->tok, r.text, r.len, DDT_TOKENIZE_ADDED, &out->ids, err, err_len);
    if (rc) {
        ddt_chat_rendered_free(&r);
        return encoding_failed(rc, err, err_len);
    }
    const size_t T = out->ids.count;
    size_t *edges = malloc((size_t)(2 * r.n_spans + 1) * sizeof *edges);
    int64_t *index = malloc((size_t)(2 * r.n_spans + 1) * sizeof *index);
    if (!edges || !index)
        ddk_fatal(__FILE__, __LINE__, "out of memory for %d spans", r.n_spans);
    for (int i = 0; i < r.n_spans; i++) {
        edges[2 * i] = r.spans[i].start;
        edges[2 * i + 1] = r.spans[i].end;
    }
    why = edge_tokens(e, r.text, r.len, &out->ids, edges, 2 * r.n_spans, index, err, err_len);
    grow_mask(out, T ? T : 1);
    memset(out->mask, 0, T);
    for (int i = 0; !why && i < r.n_spans; i++)
        for (int64_t t = index[2 * i]; t < index[2 * i + 1] && t < (int64_t)T; t++)
            out->mask[t] = 1;
    free(edges);
    free(index);
    ddt_chat_rendered_free(&r);
    if (why)
        return why;
    if (max_len > 0 && (int64_t)T > max_len) {
        out->ids.count = (size_t)max_len;
        out->truncated = 1;
    }
    for (size_t t = 0; t < out->ids.count; t++)
        out->masked += out->mask[t];
    if (!ddt_chat_mask_trainable(out->mask, out->ids.count)) {
        snprintf(err, err_len, "%lld tokens%s, none of them two trained ones in a row (an assistant turn of at "
                 "least two tokens is needed)", (long long)out->ids.count, out->truncated ? " after the cut" : "");
        return DDT_CHAT_NOT_TRAINED;
    }
    return DDT_CHAT_OK;
}

ddt_chat_refusal ddt_chat_tokens_line(const ddt_chat_encoder *e, const char *line, size_t len, int64_t max_len,
                                      ddt_chat_tokens *out, char *err, size_t err_len)
{
    ddt_chat chat;
    out->ids.count = 0;
    ddt_chat_refusal why = ddt_chat_parse_line(line, len, &chat, err, err_len);
    if (why)
        return why;
    why = ddt_chat_tokens_encode(e, &chat, max_len, out, err, err_len);
    ddt_chat_free(&chat);
    return why;
}

ddt_chat_refusal ddt_chat_tokens_prompt(const ddt_chat_encoder *e, const ddt_chat *chat, ddt_token_ids *out,
                                        char *err, size_t err_len)
{
    out->count = 0;
    ddt_chat_rendered r;
    ddt_chat_refusal why = ddt_chat_render_prompt(chat, &e->opt, &r, err, err_len);
    if (why)
        return why;
    int rc = ddt_tokenizer_encode(e->tok, r.text, r.len, DDT_TOKENIZE_ADDED, out, err, err_len);
    ddt_chat_rendered_free(&r);
    return rc ? encoding_failed(rc, err, err_len) : DDT_CHAT_OK;
}

/* ------------------------------------------------------------------------------------------
 * JSON Lines files
 */

int ddt_chat_file_open(const char *path, ddt_chat_file *f, char *err, size_t err_len)
{
    memset(f, 0, sizeof *f);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st)) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        return ddt_fail_path(err, err_len, -e, path, "cannot be read: %s", strerror(e));
    }
    f->size = (size_t)st.st_size;
    if (f->size) {
        void *m = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            int e = errno;
            close(fd);
            memset(f, 0, sizeof *f);
            return ddt_fail_path(err, err_len, -e, path, "cannot be mapped: %s", strerror(e));
        }
        f->data = m;
        f->fd = fd;   /* kept while mapped */
        madvise(m, f->size, MADV_SEQUENTIAL);
    } else {
        close(fd);
    }
    if (!(f->path = strdup(path))) {
        ddt_chat_file_close(f);
        return ddt_fail_path(err, err_len, -ENOMEM, path, "out of memory");
    }
    int64_t n = 0;
    for (const char *p = f->data, *end = f->data + f->size; p && p < end; n++) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        p = nl ? nl + 1 : end;
    }
    f->starts = malloc((size_t)(n + 1) * sizeof *f->starts);
    if (!f->starts) {
        ddt_chat_file_close(f);
        return ddt_fail_path(err, err_len, -ENOMEM, path, "no memory for the index of its %lld lines", (long long)n);
    }
    f->n_lines = n;
    int64_t i = 0;
    for (const char *p = f->data, *end = f->data + f->size; p && p < end; i++) {
        f->starts[i] = p - f->data;
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        p = nl ? nl + 1 : end;
    }
    f->starts[n] = (int64_t)f->size;
    return 0;
}

void ddt_chat_file_close(ddt_chat_file *f)
{
    if (f->data) {
        munmap((void *)f->data, f->size);
        close(f->fd);
    }
    free(f->starts);
    free(f->path);
    memset(f, 0, sizeof *f);
}

const char *ddt_chat_file_line(const ddt_chat_file *f, int64_t i, size_t *len)
{
    const char *line = f->data + f->starts[i];
    size_t n = (size_t)(f->starts[i + 1] - f->starts[i]);
    if (n && line[n - 1] == '\n')
        n--;
    if (n && line[n - 1] == '\r')
        n--;
    *len = n;
    return line;
}

/* what ddt_chat_file_copy_line asks of the guarded read */
typedef struct line_copy {
    char *to;
    const char *from;
    size_t len;
} line_copy;

static void copy_line(void *arg)
{
    const line_copy *c = arg;
    memcpy(c->to, c->from, c->len);
}

int ddt_chat_file_copy_line(const ddt_chat_file *f, int64_t i, char **buf, size_t *cap, size_t *len, char *err,
                            size_t err_len)
{
    size_t n = (size_t)(f->starts[i + 1] - f->starts[i]);
    if (n + 1 > *cap) {
        char *grown = realloc(*buf, n + 1);
        if (!grown)
            return ddt_fail_path(err, err_len, -ENOMEM, f->path, "no memory for line %lld (%zu bytes)", (long long)i + 1,
                                 n);
        *buf = grown;
        *cap = n + 1;
    }
    const ddt_mapped_file m = { f->path, f->fd, f->data, f->size };
    line_copy c = { *buf, f->data + f->starts[i], n };
    int rc = n ? ddt_mapped_read(&m, (size_t)f->starts[i], copy_line, &c, err, err_len) : 0;
    if (rc)
        return rc;
    if (n && (*buf)[n - 1] == '\n')   /* the newline cut as ddt_chat_file_line cuts it */
        n--;
    if (n && (*buf)[n - 1] == '\r')
        n--;
    (*buf)[n] = '\0';
    *len = n;
    return 0;
}

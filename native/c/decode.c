/* A few tokens of one sequence through every layer, in one call.
 *
 * A decode step is one activation row (a speculative verify, a draft's catch-up: a few). Its products stream the weights at the memory's
 * speed; what keeps it from the bandwidth is the rest: about fifteen small operations per
 * layer (norms, RoPE, attention, residual and bias adds), each a Python-level call of a
 * few microseconds when the forward pass runs them one by one. Here they run back to back
 * in C, through the same functions in the same order as forward.py's per-operation path,
 * so the logits are bit for bit the same (tests/native/test_decode_step.py holds them).
 * Every architecture config.py knows: the differences it reads from li_layer and
 * li_decoder are the ones forward.py reads from config.Architecture.
 */
#include <stdint.h>

#include "kernels.h"

/* One layer's weights: its bound products, norms and (qwen2's) q/k/v biases. */
typedef struct {
    const li_op *qkv, *o, *gate_up, *down; /* gate_up and down 0 where moe is set */
    const li_moe *moe;                     /* a mixture of experts' FFN (moe.c); 0 for a dense one */
    const float *attn_norm, *ffn_norm;
    const float *q_bias, *k_bias, *v_bias; /* 0 where the model has none */
    const float *q_norm, *k_norm;          /* per-head norms of q and k [hd] (qwen3, gemma3); 0 where none */
    const float *post_attn_norm, *post_ffn_norm; /* norms of the attention's and FFN's outputs (gemma3); 0 where none */
    const float *o_bias;                   /* the attention output's bias (gpt-oss); 0 where none */
    const float *sinks;                    /* each head's attention sink logit (gpt-oss); 0 where none */
    int64_t window;                        /* a local layer's sliding window (its own RoPE tables); 0: global */
} li_layer;

/* The model's shapes, its RoPE tables, its KV cache's types and buffers of max_rows rows. */
typedef struct {
    int64_t n_layer, n_embd, n_head, n_head_kv, hd, n_ff, n_ctx, rope_dims, max_rows;
    int32_t neox, type_k, type_v, gelu; /* gelu: GeGLU feed-forward, else SwiGLU */
    int64_t rot_k, rot_v;
    float eps, scale;
    const float *cos_t, *sin_t, *cos_local, *sin_local; /* RoPE tables of global and local layers */
    const li_layer *layers;
    float *h, *q, *k, *v, *attn, *o, *gate, *up;
    const int32_t *nthreads;
} li_decoder;

int li_decoder_size(void) { return (int)sizeof(li_decoder); }
int li_layer_size(void) { return (int)sizeof(li_layer); }

static void add_into(float *x, const float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] += y[i];
}

/* x [n, n_embd]: the tokens' embeddings in, the last layer's outputs out; pos [n]: their
 * positions, one sequence's, in order. keys/values: that sequence's cache, [n_layer,
 * n_head_kv, n_ctx] rows of the cache's types. 0, or the first error code of the operations
 * (li_matmul's, li_attention's); 3 for a position outside the cache or n outside 1..max_rows. */
int li_decode(const li_decoder *d, float *x, int64_t n, const int32_t *pos, uint8_t *keys, uint8_t *values) {
    const int64_t q_dim = d->n_head * d->hd, kv_dim = d->n_head_kv * d->hd;
    const int64_t kb = li_kv_row_bytes(d->type_k, d->hd), vb = li_kv_row_bytes(d->type_v, d->hd);
    if (kb < 0 || vb < 0 || n < 1 || n > d->max_rows) return 3;
    for (int64_t i = 0; i < n; i++)
        if (pos[i] < 0 || pos[i] >= d->n_ctx) return 3;
    const int threads = d->nthreads ? *d->nthreads : 1;
    for (int64_t l = 0; l < d->n_layer; l++) {
        const li_layer *w = d->layers + l;
        li_rms_norm(x, w->attn_norm, d->h, n, d->n_embd, d->eps);
        int rc = li_matmul_op(w->qkv, d->h, n, d->q, d->k, d->v, 0);
        if (rc) return rc;
        if (w->q_bias)
            for (int64_t i = 0; i < n; i++) {
                add_into(d->q + i * q_dim, w->q_bias, q_dim);
                add_into(d->k + i * kv_dim, w->k_bias, kv_dim);
                add_into(d->v + i * kv_dim, w->v_bias, kv_dim);
            }
        if (w->q_norm) {
            li_rms_norm(d->q, w->q_norm, d->q, n * d->n_head, d->hd, d->eps);
            li_rms_norm(d->k, w->k_norm, d->k, n * d->n_head_kv, d->hd, d->eps);
        }
        const float *cos_t = w->window ? d->cos_local : d->cos_t, *sin_t = w->window ? d->sin_local : d->sin_t;
        li_rope(d->q, n, d->n_head, d->hd, pos, cos_t, sin_t, d->rope_dims, d->neox);
        li_rope(d->k, n, d->n_head_kv, d->hd, pos, cos_t, sin_t, d->rope_dims, d->neox);
        rc = li_attention(d->q, d->k, d->v, keys + l * d->n_head_kv * d->n_ctx * kb,
                          values + l * d->n_head_kv * d->n_ctx * vb, d->type_k, d->type_v, d->rot_k, d->rot_v, pos,
                          d->attn, n, d->n_head, d->n_head_kv, d->hd, d->n_ctx, d->scale, w->window, w->sinks, 1, threads);
        if (rc) return rc;
        if ((rc = li_matmul_op(w->o, d->attn, n, d->o, 0, 0, 0))) return rc;
        if (w->o_bias)
            for (int64_t i = 0; i < n; i++) add_into(d->o + i * d->n_embd, w->o_bias, d->n_embd);
        if (w->post_attn_norm) li_rms_norm(d->o, w->post_attn_norm, d->o, n, d->n_embd, d->eps);
        add_into(x, d->o, n * d->n_embd);

        li_rms_norm(x, w->ffn_norm, d->h, n, d->n_embd, d->eps);
        if (w->moe) {
            if ((rc = li_moe_ffn(w->moe, d->h, n, d->o))) return rc;
        } else {
            if ((rc = li_matmul_op(w->gate_up, d->h, n, d->gate, d->up, 0, 0))) return rc;
            (d->gelu ? li_geglu : li_swiglu)(d->gate, d->up, n * d->n_ff, threads);
            if ((rc = li_matmul_op(w->down, d->gate, n, d->o, 0, 0, 0))) return rc;
        }
        if (w->post_ffn_norm) li_rms_norm(d->o, w->post_ffn_norm, d->o, n, d->n_embd, d->eps);
        add_into(x, d->o, n * d->n_embd);
    }
    return 0;
}

/* localinfer native kernels: the contract between the C files.
 *
 * Weight rows are GGUF blocks read in place. Activations are quantized once per matmul
 * to the 8-bit block format the weight type pairs with (as ggml does): Q8_0 for
 * Q4_0/Q5_0/Q8_0, Q8_1 for Q4_1/Q5_1, Q8_K for Q4_K/Q5_K/Q6_K; F16/F32 use floats.
 * Each vec_dot computes one weight row (k values) against one quantized activation row.
 */
#ifndef LOCALINFER_KERNELS_H
#define LOCALINFER_KERNELS_H

#include <stddef.h>
#include <stdint.h>

/* ggml type ids, the same numbers GGUF stores */
enum {
    LI_F32 = 0, LI_F16 = 1, LI_Q4_0 = 2, LI_Q4_1 = 3, LI_Q5_0 = 6, LI_Q5_1 = 7,
    LI_Q8_0 = 8, LI_Q8_1 = 9, LI_Q4_K = 12, LI_Q5_K = 13, LI_Q6_K = 14, LI_Q8_K = 15,
};

#define LI_QK_K 256

/* Q8_K activation block: float scale, 256 int8, and 16 sums of 16 values each
 * (the K-quant dots need those sums for the mins). Layout as ggml's block_q8_K. */
typedef struct {
    float d;
    int8_t qs[LI_QK_K];
    int16_t bsums[LI_QK_K / 16];
} li_block_q8_K;

/* kquants.c */
void li_quantize_row_q8_K(const float *x, void *y, int64_t k);
void li_vec_dot_q4_K_q8_K(int64_t k, float *s, const void *w, const void *y);
void li_vec_dot_q5_K_q8_K(int64_t k, float *s, const void *w, const void *y);
void li_vec_dot_q6_K_q8_K(int64_t k, float *s, const void *w, const void *y);

#endif

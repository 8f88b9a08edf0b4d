/*
 * fa3_consumer: flash_attn_standalone called from plain C.
 *
 * Prints what the library holds (fa3s_get_build_info), then runs one tiny forward pass: batch 1,
 * 4 queries and 4 keys, 2 heads, head_dim 64, FP16, packed layouts. q and k are zero, so every query
 * weighs the 4 keys equally and each output element is the mean of v's rows 0, 1, 2, 3: 1.5.
 * Without a usable GPU it still calls fa3s_fwd (with NULL buffers) to show the library's answer.
 *
 * Exit status: 0 when the call succeeded and every output element is 1.5, 1 otherwise.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "flash_attn_standalone.h"

enum { SEQ = 4, HEADS = 2, DIM = 64, N = SEQ * HEADS * DIM };

/* FP16 bit patterns of 0, 1, 2, 3 and 1.5. */
static const uint16_t FP16_ROW[SEQ] = {0x0000, 0x3c00, 0x4000, 0x4200};
static const uint16_t FP16_1_5 = 0x3e00;

int main(void) {
    fa3s_build_info info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    fa3s_status status = fa3s_get_build_info(&info);
    if (status != FA3S_OK) {
        printf("fa3s_get_build_info: %s (%s)\n", fa3s_status_name(status), fa3s_last_error());
        return 1;
    }
    printf("flash_attn_standalone: ABI %d, profile %s, archs %s, head dims:", info.abi_version, info.profile,
           info.archs);
    for (int i = 0; i < 8 && info.head_dims[i] != 0; ++i) {
        printf(" %d", info.head_dims[i]);
    }
    printf("%s\n", info.head_dims[0] == 0 ? " none" : "");

    static uint16_t zeros[N], v_host[N], out_host[N];
    for (int row = 0; row < SEQ; ++row) {
        for (int e = 0; e < HEADS * DIM; ++e) {
            v_host[row * HEADS * DIM + e] = FP16_ROW[row];
        }
    }
    void *q = NULL, *k = NULL, *v = NULL, *out = NULL;
    cudaStream_t stream = NULL;
    cudaError_t err = cudaStreamCreate(&stream);
    if (err == cudaSuccess) err = cudaMalloc(&q, sizeof zeros);
    if (err == cudaSuccess) err = cudaMalloc(&k, sizeof zeros);
    if (err == cudaSuccess) err = cudaMalloc(&v, sizeof v_host);
    if (err == cudaSuccess) err = cudaMalloc(&out, sizeof out_host);
    if (err == cudaSuccess) err = cudaMemcpy(q, zeros, sizeof zeros, cudaMemcpyHostToDevice);
    if (err == cudaSuccess) err = cudaMemcpy(k, zeros, sizeof zeros, cudaMemcpyHostToDevice);
    if (err == cudaSuccess) err = cudaMemcpy(v, v_host, sizeof v_host, cudaMemcpyHostToDevice);
    if (err != cudaSuccess) {
        printf("no usable CUDA device (%s): calling fa3s_fwd without buffers, to show its answer\n",
               cudaGetErrorString(err));
    }

    fa3s_fwd_args args;
    fa3s_fwd_args_init(&args);
    args.dtype = FA3S_FP16;
    args.batch = 1;
    args.seqlen_q = SEQ;
    args.seqlen_k = SEQ;
    args.num_heads = HEADS;
    args.num_heads_k = HEADS;
    args.head_dim = DIM;
    args.q = q;
    args.k = k;
    args.v = v;
    args.out = out;
    status = fa3s_fwd(&args, NULL, 0, stream); /* NULL workspace: the library allocates it on the stream */
    printf("fa3s_fwd: %s (%s)\n", fa3s_status_name(status), fa3s_last_error());
    if (status != FA3S_OK) {
        return 1;
    }
    err = cudaStreamSynchronize(stream);
    if (err == cudaSuccess) err = cudaMemcpy(out_host, out, sizeof out_host, cudaMemcpyDeviceToHost);
    if (err != cudaSuccess) {
        printf("after fa3s_fwd: %s\n", cudaGetErrorString(err));
        return 1;
    }
    int wrong = 0;
    for (int i = 0; i < N; ++i) {
        wrong += out_host[i] != FP16_1_5;
    }
    printf("out: %d of %d elements are 1.5 (0x%04x); out[0] = 0x%04x\n", N - wrong, N, FP16_1_5, out_host[0]);
    cudaFree(q);
    cudaFree(k);
    cudaFree(v);
    cudaFree(out);
    cudaStreamDestroy(stream);
    return wrong == 0 ? 0 : 1;
}

#include "policy.h"

#include <string.h>
#include <strings.h>

/* Equal strings, in time that depends on the length of `secret` only. */
static bool same_secret(const char *given, const char *secret)
{
    size_t gl = strlen(given), sl = strlen(secret);
    unsigned char diff = (unsigned char)(gl != sl);
    for (size_t i = 0; i < sl; i++) {
        /* past the end of a short guess, compare against its NUL: still one step per key byte */
        unsigned char g = (unsigned char)given[i < gl ? i : gl];
        diff |= (unsigned char)(g ^ (unsigned char)secret[i]);
    }
    return diff == 0;
}

int dray_srv_check_auth(const char *authorization, const char *api_key, struct dray_srv_error *e)
{
    static const char scheme[] = "Bearer ";
    if (!api_key[0])
        return 0;
    if (!authorization)
        return dray_srv_fail(e, 401, "invalid_request_error", "invalid_api_key", NULL,
                             "this server needs an API key: send 'Authorization: Bearer <key>'");
    if (strncasecmp(authorization, scheme, sizeof(scheme) - 1))
        return dray_srv_fail(e, 401, "invalid_request_error", "invalid_api_key", NULL,
                             "the Authorization header must be 'Bearer <key>'");
    const char *token = authorization + sizeof(scheme) - 1;
    while (*token == ' ')
        token++;
    if (!same_secret(token, api_key))
        return dray_srv_fail(e, 401, "invalid_request_error", "invalid_api_key", NULL,
                             "incorrect API key");
    return 0;
}

int dray_srv_check_body(uint64_t bytes, uint64_t max_body, struct dray_srv_error *e)
{
    if (bytes <= max_body)
        return 0;
    return dray_srv_fail(e, 413, "invalid_request_error", "request_too_large", NULL,
                         "the request body is larger than this server accepts (%llu bytes, config "
                         "key max_body)", (unsigned long long)max_body);
}

int dray_srv_check_prompt(size_t n, uint32_t max_prompt_tokens, uint32_t context, const char *param,
                          struct dray_srv_error *e)
{
    if (max_prompt_tokens && n > max_prompt_tokens)
        return dray_srv_fail(e, 400, "invalid_request_error", "context_length_exceeded", param,
                             "the prompt is %zu tokens; this server accepts at most %u (config key "
                             "max_prompt_tokens)", n, max_prompt_tokens);
    if (n >= context)
        return dray_srv_fail(e, 400, "invalid_request_error", "context_length_exceeded", param,
                             "the prompt is %zu tokens but the context is %u tokens, which leaves "
                             "no room for a reply", n, context);
    return 0;
}

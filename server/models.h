/* server/models.h — the names clients know the served model by: the config's
 * served_model_name list (like vLLM's --served-model-name), else the GGUF file's
 * name. The first name is the one every response reports; a request may name
 * any of them or the file's name; GET /v1/models lists them with the context
 * length (max_model_len), GET /v1/models/{id} answers for each. */
#ifndef DRAY_SERVER_MODELS_H
#define DRAY_SERVER_MODELS_H

#include <stddef.h>
#include <stdint.h>

#include "apierr.h"

#define DRAY_SRV_MAX_NAMES 16
#define DRAY_SRV_NAME_LEN 256

struct dray_srv_models {
    char name[DRAY_SRV_MAX_NAMES][DRAY_SRV_NAME_LEN]; /* [n]: the listed names, name[0] reported */
    uint32_t n;
    char file[DRAY_SRV_NAME_LEN]; /* the GGUF file's name without ".gguf": also accepted */
    uint32_t max_model_len;       /* tokens per sequence */
    int64_t created;              /* Unix seconds */
};

/* served: "" or comma-separated names (spaces around each are dropped). An
 * empty name, one of DRAY_SRV_NAME_LEN bytes or more, or more than
 * DRAY_SRV_MAX_NAMES names: -1 with the reason in err. */
int dray_srv_models_init(struct dray_srv_models *m, const char *served, const char *file,
                         uint32_t max_model_len, int64_t created, char *err, size_t errlen);
/* A request's model (NULL = not named: the served one): 0, or 404 naming
 * `model` with OpenAI's model_not_found. */
int dray_srv_check_model(const struct dray_srv_models *m, const char *asked, struct dray_srv_error *e);
/* GET /v1/models: malloc'd JSON, NULL when out of memory. */
char *dray_srv_models_json(const struct dray_srv_models *m);
/* GET /v1/models/{id}: the model object with that id, or NULL with e filled
 * (404 for a name this server does not serve, 500 out of memory). */
char *dray_srv_model_json(const struct dray_srv_models *m, const char *id, struct dray_srv_error *e);

#endif

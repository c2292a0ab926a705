#include "models.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "dray/dray.h"

int dray_srv_models_init(struct dray_srv_models *m, const char *served, const char *file,
                         uint32_t max_model_len, int64_t created, char *err, size_t errlen)
{
    *m = (struct dray_srv_models){.max_model_len = max_model_len, .created = created};
    snprintf(m->file, sizeof(m->file), "%s", file);
    const char *p = served;
    while (*p == ' ')
        p++;
    if (!*p) { /* none configured: the file's name */
        snprintf(m->name[0], sizeof(m->name[0]), "%s", m->file);
        m->n = 1;
        return 0;
    }
    uint32_t n = dray_config_list_len(served);
    for (uint32_t i = 0; i < n; i++) {
        char name[DRAY_SRV_NAME_LEN + 1];
        dray_config_list_entry(served, i, name, sizeof(name));
        if (!name[0]) {
            snprintf(err, errlen, "served_model_name '%.200s': name %u is empty", served, i + 1);
            return -1;
        }
        if (strlen(name) >= DRAY_SRV_NAME_LEN || i == DRAY_SRV_MAX_NAMES) {
            snprintf(err, errlen, "served_model_name: at most %d names of at most %d bytes each",
                     DRAY_SRV_MAX_NAMES, DRAY_SRV_NAME_LEN - 1);
            return -1;
        }
        snprintf(m->name[m->n++], sizeof(m->name[0]), "%s", name);
    }
    return 0;
}

static bool serves(const struct dray_srv_models *m, const char *name)
{
    if (!strcmp(name, m->file))
        return true;
    for (uint32_t i = 0; i < m->n; i++)
        if (!strcmp(name, m->name[i]))
            return true;
    return false;
}

int dray_srv_check_model(const struct dray_srv_models *m, const char *asked, struct dray_srv_error *e)
{
    if (!asked || serves(m, asked))
        return 0;
    return dray_srv_fail(e, 404, "invalid_request_error", "model_not_found", "model",
                         "the model '%.200s' does not exist; this server runs '%.200s' (GET /v1/models)",
                         asked, m->name[0]);
}

static json_t *model_object(const struct dray_srv_models *m, const char *id)
{
    return json_pack("{s:s, s:s, s:I, s:s, s:s, s:I}", "id", id, "object", "model", "created",
                     (json_int_t)m->created, "owned_by", "dray", "root", m->file, "max_model_len",
                     (json_int_t)m->max_model_len);
}

static char *dump(json_t *root)
{
    char *out = root ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    return out;
}

char *dray_srv_models_json(const struct dray_srv_models *m)
{
    json_t *data = json_array();
    for (uint32_t i = 0; data && i < m->n; i++)
        if (json_array_append_new(data, model_object(m, m->name[i]))) {
            json_decref(data);
            return NULL;
        }
    return dump(data ? json_pack("{s:s, s:o}", "object", "list", "data", data) : NULL);
}

char *dray_srv_model_json(const struct dray_srv_models *m, const char *id, struct dray_srv_error *e)
{
    if (dray_srv_check_model(m, id, e))
        return NULL;
    /* json_pack refuses an id that is not UTF-8 (the path's bytes); serves() matched it
     * against the configured names, which the config reader took as text */
    char *out = dump(model_object(m, id));
    if (!out)
        dray_srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    return out;
}

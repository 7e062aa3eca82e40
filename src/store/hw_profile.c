/* hw_profile.c - read the disk paths' bandwidth from a hardware profile written by
 * `strata probe -o FILE`, as the state store's per-path weights. */
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "strata/store.h"

/* A bandwidth field: absent (or null) reads as 0; present, it must be a finite number
 * >= 0 (json-c reads Infinity, NaN and 1e999, which would take every subgroup or none). */
static st_status num(json_object *o, const char *key, const char *profile, const char *path, double *out,
                     st_err *err) {
    json_object *v;
    *out = 0.0;
    if (!json_object_object_get_ex(o, key, &v) || json_object_is_type(v, json_type_null)) return ST_OK;
    double d = json_object_get_double(v);
    if ((!json_object_is_type(v, json_type_double) && !json_object_is_type(v, json_type_int)) || !isfinite(d) ||
        d < 0)
        return st_errf(err, ST_ERR_FORMAT, "%s: path '%s': \"%s\" is %s; a bandwidth is a finite number of GB/s >= 0 "
                       "(probe it again with strata probe --path %s)", profile, path, key,
                       json_object_to_json_string(v), path);
    *out = d;
    return ST_OK;
}

st_status st_store_weights_from_profile(const char *profile, const char *const *paths, int n_paths, double *weights,
                                        st_err *err) {
    json_object *root = json_object_from_file(profile);
    json_object *arr;
    if (!root) {
        char why[512];
        const char *je = json_util_get_last_err();
        snprintf(why, sizeof why, "%s", je ? je : "unknown error");
        why[strcspn(why, "\n")] = 0; /* json-c ends its message with a newline */
        return st_errf(err, ST_ERR_FORMAT, "%s: not a readable JSON hardware profile (%s); write one with strata "
                       "probe --path DIR ... -o %s", profile, why, profile);
    }
    if (!json_object_object_get_ex(root, "paths", &arr) || !json_object_is_type(arr, json_type_array)) {
        json_object_put(root);
        return st_errf(err, ST_ERR_FORMAT, "%s: no \"paths\" array; is it a strata probe profile?", profile);
    }
    st_status s = ST_OK;
    for (int p = 0; p < n_paths && !s; p++) {
        weights[p] = 0;
        size_t len = json_object_array_length(arr);
        for (size_t i = 0; i < len; i++) {
            json_object *e = json_object_array_get_idx(arr, i), *pv;
            if (!json_object_object_get_ex(e, "path", &pv) || !json_object_is_type(pv, json_type_string) ||
                strcmp(json_object_get_string(pv), paths[p]))
                continue;
            /* the mixed pass is what a step does; older profiles: read and write in turn */
            double m, r, w;
            if ((s = num(e, "mixed_gbps", profile, paths[p], &m, err)) ||
                (s = num(e, "read_gbps", profile, paths[p], &r, err)) ||
                (s = num(e, "write_gbps", profile, paths[p], &w, err)))
                break;
            weights[p] = m > 0 ? m : (r > 0 && w > 0 ? 1.0 / (1.0 / r + 1.0 / w) : 0.0);
        }
        if (s) break;
        if (!(weights[p] > 0))
            s = st_errf(err, ST_ERR_INVALID, "%s: no bandwidth for path '%s'; probe it with strata probe --path %s "
                        "(the path must be written the same way)", profile, paths[p], paths[p]);
    }
    json_object_put(root);
    return s;
}

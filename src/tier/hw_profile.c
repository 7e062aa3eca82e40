/* hw_profile.c - read the disk paths' bandwidth from a hardware profile written by
 * `strata probe -o FILE`, as the state store's per-path weights. */
#include <json-c/json.h>
#include <stdio.h>
#include <string.h>

#include "strata/store.h"

static double num(json_object *o, const char *key) {
    json_object *v;
    return json_object_object_get_ex(o, key, &v) ? json_object_get_double(v) : 0.0;
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
            double m = num(e, "mixed_gbps"), r = num(e, "read_gbps"), w = num(e, "write_gbps");
            weights[p] = m > 0 ? m : (r > 0 && w > 0 ? 1.0 / (1.0 / r + 1.0 / w) : 0.0);
        }
        if (!(weights[p] > 0))
            s = st_errf(err, ST_ERR_INVALID, "%s: no bandwidth for path '%s'; probe it with strata probe --path %s "
                        "(the path must be written the same way)", profile, paths[p], paths[p]);
    }
    json_object_put(root);
    return s;
}

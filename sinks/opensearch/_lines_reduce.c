#include "_lines.h"

/* ---- reduce: documents.reduce for the common batch, in C --------------------------------------
 *
 * reduce(events, TopicActions, Op.TRUNCATE, Op.DELETE, Upsert, Delete, Tombstone, max_id_bytes)
 *   -> {topic: TopicActions} or None
 * The same state machine as documents.reduce for batches whose events are inserts, updates,
 * reads, deletes and tombstones (with their delete's version, a delete; without, a Tombstone
 * action) with a key of one column that is an int or a str of at most
 * max_id_bytes UTF-8 bytes (its _id is its text). At the first event outside that (a truncate, a
 * composite key, ...) it returns None and documents.reduce does the whole batch. */

static PyObject *
id_of(PyObject *key, Py_ssize_t max_id_bytes)
{
    if (!PyDict_CheckExact(key) || PyDict_GET_SIZE(key) != 1)
        return NULL;
    Py_ssize_t pos = 0;
    PyObject *name, *value;
    PyDict_Next(key, &pos, &name, &value);
    if (PyLong_CheckExact(value))
        return PyObject_Str(value);
    if (PyUnicode_CheckExact(value)) {
        Py_ssize_t size;
        if (PyUnicode_AsUTF8AndSize(value, &size) == NULL)
            return NULL;
        if (size <= max_id_bytes)
            return Py_NewRef(value);
    }
    return NULL;
}

PyObject *
lines_reduce(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "reduce takes 8 arguments");
        return NULL;
    }
    PyObject *events = args[0], *topic_actions = args[1], *op_truncate = args[2], *op_delete = args[3];
    PyObject *upsert = args[4], *delete = args[5], *tombstone = args[6];
    Py_ssize_t max_id_bytes = PyLong_AsSsize_t(args[7]);
    if (max_id_bytes == -1 && PyErr_Occurred())
        return NULL;
    if (!PyList_Check(events)) {
        PyErr_SetString(PyExc_TypeError, "events must be a list");
        return NULL;
    }
    PyObject *out = PyDict_New();         /* topic -> TopicActions */
    PyObject *dicts = PyDict_New();       /* topic -> its actions dict */
    if (out == NULL || dicts == NULL)
        goto fail;
    PyObject *last_topic = NULL, *actions = NULL;  /* borrowed */
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(events); i++) {
        PyObject *event = PyList_GET_ITEM(events, i);
        if (!PyTuple_Check(event) || PyTuple_GET_SIZE(event) < 8)
            goto fallback;
        /* SinkEvent(topic, partition, offset, key, op, before, after, version, source, ts_ms) */
        PyObject *topic = PyTuple_GET_ITEM(event, 0), *key = PyTuple_GET_ITEM(event, 3);
        PyObject *op = PyTuple_GET_ITEM(event, 4), *after = PyTuple_GET_ITEM(event, 6);
        PyObject *version = PyTuple_GET_ITEM(event, 7);
        if (op == op_truncate)
            goto fallback;
        if (topic != last_topic) {
            actions = PyDict_GetItemWithError(dicts, topic);
            if (actions == NULL) {
                if (PyErr_Occurred())
                    goto fail;
                PyObject *made = PyDict_New();
                if (made == NULL)
                    goto fail;
                PyObject *entry = PyObject_CallFunctionObjArgs(topic_actions, topic, event, made, NULL);
                int stored = entry != NULL && PyDict_SetItem(out, topic, entry) == 0
                             && PyDict_SetItem(dicts, topic, made) == 0;
                Py_XDECREF(entry);
                Py_DECREF(made);
                if (!stored)
                    goto fail;
                actions = made;  /* dicts holds it */
            }
            last_topic = topic;
        }
        PyObject *doc_id = id_of(key, max_id_bytes);
        if (doc_id == NULL) {
            if (PyErr_Occurred())
                goto fail;
            goto fallback;
        }
        PyObject *previous = PyDict_GetItemWithError(actions, doc_id);  /* borrowed */
        if (previous == NULL && PyErr_Occurred()) {
            Py_DECREF(doc_id);
            goto fail;
        }
        PyObject *action = NULL;
        if (op == Py_None && version == Py_None) {
            PyObject *kind = previous ? (PyObject *)Py_TYPE(previous) : NULL;
            if (kind == delete) {
                Py_DECREF(doc_id);
                continue;
            }
            PyObject *floor = kind == upsert ? PyTuple_GET_ITEM(previous, 1)
                              : kind == tombstone ? PyTuple_GET_ITEM(previous, 1) : Py_None;
            action = PyObject_CallFunctionObjArgs(tombstone, doc_id, floor, event, NULL);
        } else {
            if (!PyLong_Check(version)) {
                Py_DECREF(doc_id);
                goto fallback;
            }
            if (previous != NULL && Py_TYPE(previous) != (PyTypeObject *)tombstone) {
                int newer = PyObject_RichCompareBool(PyTuple_GET_ITEM(previous, 1), version, Py_GE);
                if (newer < 0) {
                    Py_DECREF(doc_id);
                    goto fail;
                }
                if (newer) {
                    Py_DECREF(doc_id);
                    continue;
                }
            }
            int is_delete = op == op_delete || op == Py_None;  /* a tombstone with its delete's version */
            PyTypeObject *type = (PyTypeObject *)(is_delete ? delete : upsert);
            PyObject *row = after;
            if (!is_delete && !PyObject_IsTrue(after)) {  /* event.after or {} */
                if (PyErr_Occurred()) {
                    Py_DECREF(doc_id);
                    goto fail;
                }
                row = NULL;
            }
            action = type->tp_alloc(type, is_delete ? 3 : 4);
            if (action != NULL) {
                PyTuple_SET_ITEM(action, 0, Py_NewRef(doc_id));
                PyTuple_SET_ITEM(action, 1, Py_NewRef(version));
                if (is_delete) {
                    PyTuple_SET_ITEM(action, 2, Py_NewRef(event));
                } else {
                    PyObject *body = row ? Py_NewRef(row) : PyDict_New();
                    if (body == NULL) {
                        Py_DECREF(action);
                        action = NULL;
                    } else {
                        PyTuple_SET_ITEM(action, 2, body);
                        PyTuple_SET_ITEM(action, 3, Py_NewRef(event));
                    }
                }
            }
        }
        int stored = action != NULL && PyDict_SetItem(actions, doc_id, action) == 0;
        Py_XDECREF(action);
        Py_DECREF(doc_id);
        if (!stored)
            goto fail;
    }
    Py_DECREF(dicts);
    return out;
fallback:
    Py_DECREF(out);
    Py_DECREF(dicts);
    Py_RETURN_NONE;
fail:
    Py_XDECREF(out);
    Py_XDECREF(dicts);
    return NULL;
}

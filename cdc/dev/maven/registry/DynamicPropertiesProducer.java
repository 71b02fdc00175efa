package cdcdev.registry;

import io.apicurio.common.apps.config.DynamicConfigPropertyList;
import java.util.ArrayList;
import javax.enterprise.context.ApplicationScoped;
import javax.enterprise.inject.Produces;

/**
 * Stands in for the bean the registry's config-index Quarkus extension would generate at build
 * time: that extension's deployment half is not on Maven Central, so it is left out of the build
 * (see registry.xml). The list names the properties an admin may change at run time through the
 * registry's API; the local stack changes none, so it is empty.
 */
@ApplicationScoped
public class DynamicPropertiesProducer {
    @Produces
    @ApplicationScoped
    DynamicConfigPropertyList dynamicConfigPropertyList() {
        return new DynamicConfigPropertyList(new ArrayList<>());
    }
}

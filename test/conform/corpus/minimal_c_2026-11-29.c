typedef int nxmem_placeholder;
